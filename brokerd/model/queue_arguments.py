"""The optional arguments of queue.declare that shape a queue's life, checked once.

RabbitMQ users pass these as ``x-`` arguments; a value of the wrong type or
out of range is refused with 406 PRECONDITION_FAILED naming the argument, as
RabbitMQ does, and an unknown ``x-`` argument is kept but has no effect
(``x-backlog-alarm`` is brokerd's own). Which queue types and arguments a new
queue may have is L{brokerd.model.queue_types}'s; how a policy's keys merge
with these into a queue's effective settings, L{brokerd.model.policy_effects}'s.
"""

import datetime
import decimal

from brokerd.errors import PreconditionFailed

OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
MAX_PRIORITY = 255


class QueueArguments:
    """
    What a queue's declare arguments ask of it.

    @ivar max_priority: highest priority (1-255) of a priority queue, else None
        (x-max-priority 0 too).
    @ivar message_ttl: milliseconds a message may wait in the queue, or None.
    @ivar expires: milliseconds the queue may go unused before it is deleted, or None.
    @ivar dead_letter_exchange: where dead messages go, or None (they are dropped).
    @ivar dead_letter_routing_key: the routing key they go with, or None (their own).
    @ivar max_length: most ready messages, or None.
    @ivar max_length_bytes: most body bytes of ready messages, or None.
    @ivar overflow: what a full queue does: one of L{OVERFLOW_MODES}.
    @ivar delivery_limit: returns a message may have before it is dead-lettered, or None.
    @ivar quorum: True for a quorum queue (x-queue-type quorum).
    @ivar single_active_consumer: True if one consumer at a time gets messages.
    @ivar backlog_alarm: ready messages above which the queue's backlog alarm goes off
        (x-backlog-alarm, brokerd's own), or None.
    @ivar consumer_timeout: milliseconds a delivery from the queue may stay un-acked before
        its channel is closed (x-consumer-timeout, as RabbitMQ 3.12), or None: the broker's.
    """

    def __init__(self, arguments, queue_name="", vhost_name=""):
        self._where = f"queue {queue_name!r} in vhost {vhost_name!r}"
        get = arguments.get
        self.max_priority = self._max_priority(get("x-max-priority"))
        self.message_ttl = self._whole(get("x-message-ttl"), "x-message-ttl", 0)
        self.expires = self._whole(get("x-expires"), "x-expires", 1)
        self.dead_letter_exchange = self._text(
            get("x-dead-letter-exchange"), "x-dead-letter-exchange"
        )
        self.dead_letter_routing_key = self._text(
            get("x-dead-letter-routing-key"), "x-dead-letter-routing-key"
        )
        if self.dead_letter_routing_key is not None and self.dead_letter_exchange is None:
            raise self._invalid("x-dead-letter-routing-key", "it needs x-dead-letter-exchange too")
        self.max_length = self._whole(get("x-max-length"), "x-max-length", 0)
        self.max_length_bytes = self._whole(get("x-max-length-bytes"), "x-max-length-bytes", 0)
        overflow = self._text(get("x-overflow"), "x-overflow")
        if overflow is not None and overflow not in OVERFLOW_MODES:
            raise self._invalid(
                "x-overflow", f"{overflow!r} is none of {', '.join(OVERFLOW_MODES)}"
            )
        self.overflow = overflow or "drop-head"
        self.delivery_limit = self._whole(get("x-delivery-limit"), "x-delivery-limit", 0)
        self.quorum = get("x-queue-type") == "quorum"
        self.single_active_consumer = get("x-single-active-consumer") is True
        self.backlog_alarm = self._whole(get("x-backlog-alarm"), "x-backlog-alarm", 0)
        self.consumer_timeout = self._whole(get("x-consumer-timeout"), "x-consumer-timeout", 0)

    @property
    def rabbitmq_type_module(self):
        """The queue's type as RabbitMQ names it in refusals."""
        return "rabbit_quorum_queue" if self.quorum else "rabbit_classic_queue"

    @property
    def limited(self):
        return self.max_length is not None or self.max_length_bytes is not None

    @property
    def needs_messages(self):
        """
        True if the queue must see each message (priority, expiry, size) and so
        cannot page its backlog out.
        """
        return (
            self.max_priority is not None
            or self.message_ttl is not None
            or self.max_length_bytes is not None
        )

    def _invalid(self, name, reason):
        return PreconditionFailed(f"invalid arg {name!r} for {self._where}: {reason}")

    def _max_priority(self, value):
        """
        x-max-priority as RabbitMQ takes it, with its refusal texts: 0 is a
        queue without priorities.
        """
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._invalid(
                "x-max-priority", f'"expected integer, got {amqp_type_name(value)}"'
            )
        if value < 0:
            raise self._invalid("x-max-priority", f"{{value_negative,{value}}}")
        if value > MAX_PRIORITY:
            raise self._invalid("x-max-priority", f"{{max_value_exceeded,{value}}}")
        return value or None

    def _whole(self, value, name, smallest, largest=None):
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._invalid(name, f"{value!r} is not a whole number")
        if value < smallest or (largest is not None and value > largest):
            bounds = f"{smallest}..{largest}" if largest is not None else f"at least {smallest}"
            raise self._invalid(name, f"{value} is outside {bounds}")
        return value

    def _text(self, value, name):
        if value is None:
            return None
        if isinstance(value, bytes):
            try:
                value = value.decode("utf-8")
            except UnicodeDecodeError:
                raise self._invalid(name, "it is not UTF-8 text") from None
        if not isinstance(value, str):
            raise self._invalid(name, f"{value!r} is not a string")
        return value


def message_ttl_of(properties):
    """
    A message's own time to live from its C{expiration} property (milliseconds
    as a decimal string), or None if it has none.

    @raise PreconditionFailed: if the property is not such a number (RabbitMQ
        refuses such a publish the same way).
    """
    if not properties.HasField("expiration"):
        return None
    text = properties.expiration
    if not text.isdigit() or not text.isascii():
        raise PreconditionFailed(
            f"invalid expiration {text!r}: it must be milliseconds as a decimal string"
        )
    return int(text)


def amqp_type_name(value):
    """The name RabbitMQ gives the AMQP field type that carries C{value}, for its refusal texts."""
    if value is None:
        return "void"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint" if -(2**31) <= value < 2**31 else "long"
    if isinstance(value, str):
        return "longstr"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "binary"
    if isinstance(value, float):
        return "double"
    if isinstance(value, decimal.Decimal):
        return "decimal"
    if isinstance(value, datetime.datetime):
        return "timestamp"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, (list, tuple)):
        return "array"
    return type(value).__name__


def argument_difference(received, current):
    """
    How a redeclared argument differs, in RabbitMQ's words: C{received '2' but
    current is '1'}, or, where one side has none, C{received none but current
    is the value '1' of type 'signedint'}.
    """
    if received is None or current is None:
        return f"received {_described(received)} but current is {_described(current)}"
    return f"received '{_shown(received)}' but current is '{_shown(current)}'"


def _described(value):
    if value is None:
        return "none"
    return f"the value '{_shown(value)}' of type '{amqp_type_name(value)}'"


def _shown(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def erlang_term(value):
    """
    C{value} as RabbitMQ prints the AMQP field value it holds (Erlang's
    C{~p}) in refusal texts: C{<<"bogus">>}, C{true}, C{undefined},
    C{{1,15}} for a decimal 1.5, C{[{<<"a">>,signedint,1}]} for a table.
    """
    if value is None:
        return "undefined"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _erlang_binary(value.encode("utf-8"), value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _erlang_binary(bytes(value))
    if isinstance(value, decimal.Decimal):
        sign, digits, exponent = value.as_tuple()
        unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
        return f"{{{max(-exponent, 0)},{unscaled * 10 ** max(exponent, 0)}}}"
    if isinstance(value, datetime.datetime):
        return str(int(value.timestamp()))
    if isinstance(value, dict):
        fields = (
            f"{{{erlang_term(name)},{amqp_type_name(item)},{erlang_term(item)}}}"
            for name, item in value.items()
        )
        return f"[{','.join(fields)}]"
    if isinstance(value, (list, tuple)):
        return f"[{','.join(f'{{{amqp_type_name(item)},{erlang_term(item)}}}' for item in value)}]"
    return str(value)


def _erlang_binary(data, text=None):
    """
    A binary as Erlang prints it: C{<<"text">>} if every byte is printable
    Latin-1, else its bytes in decimal.
    """
    if not data:
        return "<<>>"
    if all(32 <= byte <= 126 or byte >= 160 for byte in data):
        # The same bytes on the wire as Erlang's:
        shown = data.decode("latin-1") if text is None else text
        return '<<"' + shown.replace("\\", "\\\\").replace('"', '\\"') + '">>'
    return f"<<{','.join(map(str, data))}>>"
