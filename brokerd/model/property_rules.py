"""What message properties and field tables may hold: the rules every way of
publishing and declaring checks before anything is kept.

A message the broker keeps must be deliverable in both protocols and readable
back from every store, and a declare's arguments must be storable, so:

  - field tables and arrays nest at most L{MAX_TABLE_DEPTH} levels, the
    headers or arguments table counting 1 (stores keep them as nested
    protobuf, which is parsed back under a depth limit);
  - priority and delivery_mode are AMQP octets (0..255);
  - the short-string properties and every field name hold at most 255 bytes
    of UTF-8;
  - every table value fits its AMQP type: an integer its kind's range, a
    decimal an octet scale and a signed 32-bit value. A timestamp published
    through the native protocol, whose clients read it as a datetime, lies in
    the years 1..9999; AMQP may send any 64-bit number of seconds, which is
    kept and passed on as it came.

Properties decoded from AMQP bytes can only hold what AMQP carries, and their
decoder enforces the depth, so they need no second look; every other message
is checked by L{check_properties}. A refusal is 406 PRECONDITION_FAILED naming
the property, header or argument and the rule.
"""

import datetime
import decimal

from brokerd.errors import PreconditionFailed
from brokerd.proto import messages_pb2
from brokerd.proto.tables import (
    FIRST_DATETIME_SECONDS,
    LAST_DATETIME_SECONDS,
    MAX_TABLE_DEPTH,
    TimestampSeconds,
)

SHORT_STRING_LIMIT = 255  # bytes of UTF-8 in an AMQP short string
_SHORT_STRING_PROPERTIES = frozenset(
    (
        "content_type", "content_encoding", "correlation_id", "reply_to", "expiration",
        "message_id", "type", "user_id", "app_id",
    )
)
_OCTET_PROPERTIES = frozenset(("priority", "delivery_mode"))
_MOST_CHARACTERS_ALWAYS_SHORT = SHORT_STRING_LIMIT // 4  # UTF-8 takes at most 4 bytes a character

_Kind = messages_pb2.IntegerKind
# IntegerKind -> (smallest, largest) value AMQP carries for it
# ('L' is read signed, as pamqp reads it)
INTEGER_KIND_RANGES = {
    _Kind.INT8: (-(2**7), 2**7 - 1),
    _Kind.UINT8: (0, 2**8 - 1),
    _Kind.INT16: (-(2**15), 2**15 - 1),
    _Kind.UINT16: (0, 2**16 - 1),
    _Kind.INT32: (-(2**31), 2**31 - 1),
    _Kind.UINT32: (0, 2**32 - 1),
    _Kind.INT64: (-(2**63), 2**63 - 1),
    _Kind.UINT64: (-(2**63), 2**63 - 1),
}
_INT64_MIN, _INT64_MAX = INTEGER_KIND_RANGES[_Kind.INT64]
_INT32_MIN, _INT32_MAX = INTEGER_KIND_RANGES[_Kind.INT32]
MAX_DECIMAL_SCALE = 255

HEADER = "header"
ARGUMENT = "arg"


def table_too_deep(kind, name):
    """The refusal of field C{name} of a headers (C{kind} L{HEADER}) or
    arguments (L{ARGUMENT}) table whose tables and arrays nest deeper than
    L{MAX_TABLE_DEPTH}."""
    return PreconditionFailed(
        f"invalid {kind} {_short(name)}: field tables and arrays nest deeper than the limit of"
        f" {MAX_TABLE_DEPTH} levels"
    )


def check_properties(properties):
    """
    Refuses C{properties} (a C{BasicProperties} that did not come as AMQP
    bytes) unless both protocols can carry them. Costs a look at the fields
    that are set, and a walk of the headers only when there are some.

    @raise PreconditionFailed: naming the property or header and the rule.
    """
    for descriptor, value in properties.ListFields():
        name = descriptor.name
        if name in _SHORT_STRING_PROPERTIES:
            if len(value) > _MOST_CHARACTERS_ALWAYS_SHORT:
                size = _utf8_size(value)
                if size > SHORT_STRING_LIMIT:
                    raise PreconditionFailed(
                        f"invalid property {name}: {size} bytes of UTF-8, longer than the limit of"
                        f" {SHORT_STRING_LIMIT} bytes"
                    )
        elif name in _OCTET_PROPERTIES:
            if not 0 <= value <= 255:
                raise PreconditionFailed(f"invalid property {name}: {value} is outside 0..255")
        elif name == "headers" and value.fields:
            check_table(value, HEADER)


def check_table(table, kind):
    """
    Refuses a C{FieldTable} from the native protocol (headers: C{kind}
    L{HEADER}; declare arguments: L{ARGUMENT}) unless every name and value in
    it can be carried by AMQP, stored and read back.

    @raise PreconditionFailed: naming the field and the rule.
    """
    try:
        _check_fields(table.fields, 1)
    except _Refused as refused:
        raise refused.error(kind) from None


def check_arguments(arguments):
    """
    Refuses declare, bind or consume C{arguments} (a dict of Python values,
    from either protocol) unless every name and value can be stored and read
    back: depth, name lengths, integers of 64 bits, decimals of an octet scale
    and a signed 32-bit value.

    @raise PreconditionFailed: naming the argument and the rule.
    """
    if not arguments:
        return
    try:
        _check_items(arguments, 1)
    except _Refused as refused:
        raise refused.error(ARGUMENT) from None


class _Refused(Exception):
    """
    A field that breaks a rule; each enclosing table or array adds its name or
    index to C{path}.
    """

    def __init__(self, problem, too_deep=False):
        super().__init__(problem)
        self.problem = problem
        self.too_deep = too_deep
        self.name_too_long = False
        self.path = []  # innermost first: field names (str) and array indexes (int)

    def error(self, kind):
        top = self.path[-1]
        if self.too_deep:
            return table_too_deep(kind, top)
        if self.name_too_long:
            if len(self.path) == 1:
                return PreconditionFailed(f"invalid {kind} name {_short(top)}: {self.problem}")
            self.problem = f"field name of {self.problem}"
        where = ""
        if len(self.path) > 1:
            location = top[:40] + "".join(
                f"[{step}]" if isinstance(step, int) else f".{step[:20]}"
                for step in reversed(self.path[:-1])
            )
            where = f" (at {location[:100]})"
        return PreconditionFailed(f"invalid {kind} {_short(top)}{where}: {self.problem}")


def _short(name, characters=40):
    """C{name} quoted for a reply text, cut to C{characters}."""
    if len(name) > characters:
        return repr(name[:characters]) + "..."
    return repr(name)


def _utf8_size(text):
    try:
        return len(text.encode())
    except UnicodeEncodeError:
        return SHORT_STRING_LIMIT + 1  # not UTF-8 at all: no protocol carries it


def _check_name(name):
    if len(name) > _MOST_CHARACTERS_ALWAYS_SHORT:
        size = _utf8_size(name)
        if size > SHORT_STRING_LIMIT:
            refused = _Refused(
                f"{size} bytes of UTF-8, longer than the limit of {SHORT_STRING_LIMIT} bytes"
            )
            refused.name_too_long = True
            raise refused


# -- protobuf field tables (the native protocol)


def _check_fields(fields, depth):
    for field in fields:
        name = field.name
        try:
            _check_name(name)
            _check_value(field.value, depth)
        except _Refused as refused:
            refused.path.append(name)
            raise


def _check_value(value, depth):
    kind = value.WhichOneof("kind")
    if kind == "table_value":
        if depth >= MAX_TABLE_DEPTH:
            raise _Refused("too deep", too_deep=True)
        _check_fields(value.table_value.fields, depth + 1)
    elif kind == "array_value":
        if depth >= MAX_TABLE_DEPTH:
            raise _Refused("too deep", too_deep=True)
        for index, item in enumerate(value.array_value.values):
            try:
                _check_value(item, depth + 1)
            except _Refused as refused:
                refused.path.append(index)
                raise
    elif kind == "integer_value":
        limits = INTEGER_KIND_RANGES.get(value.integer_kind)
        if limits is None:
            raise _Refused(f"unknown integer kind {value.integer_kind}")
        smallest, largest = limits
        if not smallest <= value.integer_value <= largest:
            kind_name = _Kind.Name(value.integer_kind)
            raise _Refused(
                f"{value.integer_value} does not fit integer kind {kind_name}"
                f" ({smallest}..{largest})"
            )
    elif kind == "decimal_value":
        _check_decimal(value.decimal_value.scale, value.decimal_value.value)
    elif kind == "timestamp_value":
        seconds = value.timestamp_value
        if not FIRST_DATETIME_SECONDS <= seconds <= LAST_DATETIME_SECONDS:
            raise _Refused(
                f"timestamp {seconds} is outside the years 1..9999"
                f" ({FIRST_DATETIME_SECONDS}..{LAST_DATETIME_SECONDS} seconds since the epoch)"
            )
    # Strings and byte strings fit AMQP's 32-bit lengths: no frame is 4 GiB long.


def _check_decimal(scale, unscaled):
    if not 0 <= scale <= MAX_DECIMAL_SCALE:
        raise _Refused(f"decimal scale {scale} is outside 0..{MAX_DECIMAL_SCALE}")
    if not _INT32_MIN <= unscaled <= _INT32_MAX:
        raise _Refused(f"decimal value {unscaled} does not fit a signed 32-bit integer")


# -- Python values (declare arguments, from either protocol)


def _check_items(table, depth):
    for name, value in table.items():
        try:
            if not isinstance(name, str):
                raise _Refused(f"field name {name!r} is not a string")
            _check_name(name)
            _check_python(value, depth)
        except _Refused as refused:
            refused.path.append(name if isinstance(name, str) else repr(name))
            raise


def _check_python(value, depth):
    if value is None or isinstance(value, (bool, float, str, bytes, datetime.datetime)):
        return
    if isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise _Refused(f"integer {value} does not fit 64 bits")
    elif isinstance(value, dict):
        if depth >= MAX_TABLE_DEPTH:
            raise _Refused("too deep", too_deep=True)
        _check_items(value, depth + 1)
    elif isinstance(value, (list, tuple)):
        if depth >= MAX_TABLE_DEPTH:
            raise _Refused("too deep", too_deep=True)
        for index, item in enumerate(value):
            try:
                _check_python(item, depth + 1)
            except _Refused as refused:
                refused.path.append(index)
                raise
    elif isinstance(value, decimal.Decimal):
        sign, digits, exponent = value.as_tuple()
        if not isinstance(exponent, int):
            raise _Refused(f"decimal {value} is not a finite number")
        if len(digits) > 10 or (exponent > 0 and any(digits) and exponent + len(digits) > 10):
            raise _Refused(f"decimal value {str(value)[:40]} does not fit a signed 32-bit integer")
        unscaled = int("".join(map(str, digits))) * (-1 if sign else 1)
        if exponent > 0:  # stored as a whole number, scale 0
            unscaled, exponent = (unscaled * 10**exponent if unscaled else 0), 0
        _check_decimal(-exponent, unscaled)
    elif isinstance(value, TimestampSeconds):
        if not _INT64_MIN <= value.seconds <= _INT64_MAX:
            raise _Refused(f"timestamp {value.seconds} does not fit 64 bits")
    elif not isinstance(value, (bytearray, memoryview)):
        raise _Refused(f"a value of type {type(value).__name__} cannot be kept in a field table")
