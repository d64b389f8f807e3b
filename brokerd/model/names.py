"""Rules for names and routing keys, and server-generated names.

Exchange and queue names, routing keys and consumer tags are AMQP short
strings: at most 255 bytes once encoded as UTF-8. Names starting with ``amq.``
belong to the broker.
"""

import base64
import os

from brokerd.errors import AccessRefused, PreconditionFailed

MAX_SHORT_STRING_BYTES = 255
RESERVED_PREFIX = "amq."


def check_short_string(kind, value):
    """Raises PreconditionFailed unless C{value} fits an AMQP short string.

    @param kind: what the value is, for the message ("queue name", "routing key").
    """
    if not isinstance(value, str):
        raise PreconditionFailed(f"{kind} must be a string, not {type(value).__name__}")
    if len(value) <= MAX_SHORT_STRING_BYTES // 4:
        return  # a character is at most 4 bytes of UTF-8: no need to encode
    size = len(value.encode("utf-8"))
    if size > MAX_SHORT_STRING_BYTES:
        raise PreconditionFailed(
            f"{kind} is {size} bytes of UTF-8; the limit is {MAX_SHORT_STRING_BYTES}:"
            f" {value[:40]!r}..."
        )


def check_not_reserved(kind, name):
    """Raises AccessRefused if a client tries to create a name in the amq. namespace."""
    if name.startswith(RESERVED_PREFIX):
        raise AccessRefused(
            f"{kind} name {name!r} starts with the reserved prefix {RESERVED_PREFIX!r}"
        )


def _random_suffix():
    return base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode("ascii")


def generate_queue_name():
    """A server-named queue's name, as RabbitMQ spells them: ``amq.gen-...``."""
    return "amq.gen-" + _random_suffix()


def generate_consumer_tag():
    """A server-picked consumer tag: ``amq.ctag-...``."""
    return "amq.ctag-" + _random_suffix()
