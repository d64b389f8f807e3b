"""Command-line values of the limits one client is held to: the share of memory a
connection may hold on its way in, and how long a delivery may stay un-acked.

Each parser raises C{ValueError} with a sentence naming the problem, which
L{brokerd.process.tap} prefixes with the option's name.
"""

from brokerd.model.watermark import ConnectionMemoryLimits
from brokerd.units import parse_size

OFF = ("0", "none", "off")


def parse_amount(text):
    """
    A part of the memory watermark: a fraction with a decimal point (C{0.25}, as a
    float) or a size (C{256M}, as an int of bytes).
    """
    if "." in text:
        try:
            fraction = float(text)
        except ValueError:
            fraction = None
        if fraction is None or not 0 < fraction <= 1:
            raise ValueError(
                f"{text!r} is not a fraction of the watermark above 0 and at most 1 (e.g. 0.25)"
            )
        return fraction
    try:
        return parse_size(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither a fraction of the watermark (e.g. 0.25) nor a size"
            " (bytes, optionally with K, M or G)"
        ) from None


def connection_memory_limits(high, share_text, limit_text):
    """
    The L{ConnectionMemoryLimits} of the two options' texts, for a watermark of
    C{high} bytes; the C{ValueError}'s text begins with the option at fault.
    """
    amounts = []
    for option, text in (("share", share_text), ("limit", limit_text)):
        try:
            amounts.append(parse_amount(text))
        except ValueError as problem:
            raise ValueError(f"--connection-memory-{option}: {problem}") from None
    try:
        return ConnectionMemoryLimits.of_watermark(high, *amounts)
    except ValueError as problem:
        raise ValueError(f"--connection-memory-share: {problem}") from None


def parse_consumer_timeout(text):
    """Milliseconds a delivery may stay un-acked, or None for no limit (C{0}, C{none}, C{off})."""
    if text.strip().lower() in OFF:
        return None
    try:
        milliseconds = int(text)
    except ValueError:
        milliseconds = -1
    if milliseconds < 0:
        raise ValueError(f"{text!r} is not a number of milliseconds (0 or none: no timeout)")
    return milliseconds
