"""Parsing of human-typed sizes such as ``64K``, ``128M`` or ``1G``."""

_MULTIPLIERS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}


def parse_size(text):
    """Bytes in C{text}: digits with an optional K, M or G (binary) suffix.

    @raise ValueError: naming the text if it is not such a size.
    """
    cleaned = text.strip().upper().removesuffix("IB").removesuffix("B")
    digits, suffix = cleaned, ""
    if cleaned and cleaned[-1] in "KMG":
        digits, suffix = cleaned[:-1], cleaned[-1]
    if not digits.isdigit():
        raise ValueError(
            f"{text!r} is not a size; use a number of bytes, optionally with K, M or G"
        )
    return int(digits) * _MULTIPLIERS[suffix]
