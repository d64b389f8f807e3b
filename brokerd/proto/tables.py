"""Conversion between protobuf field tables and plain Python values.

AMQP field tables travel as ``FieldTable`` messages; the broker's model and the
native client work with dicts. The mapping is: None <-> void, bool <-> boolean,
int <-> integer, float <-> double, str <-> string, bytes <-> bytes, aware or naive
UTC datetime <-> timestamp, Decimal <-> decimal, dict <-> table, list <-> array.
Every value a C{FieldValue} can hold has a Python value, so reading a table never
fails: a timestamp beyond datetime's years 1-9999 (AMQP allows any 64-bit number
of seconds) reads as a L{TimestampSeconds}.
"""

import dataclasses
import datetime
import decimal

from brokerd.proto import messages_pb2

# How deep field tables and arrays may nest, counting the outermost table (a
# message's headers, a declare's arguments) as 1. Stores keep tables as nested
# protobuf messages, and protobuf refuses to parse past 100 nested messages
# (three per table level): 24 levels stay well inside that in every record and
# envelope that carries a table, so whatever is accepted can be read back.
MAX_TABLE_DEPTH = 24

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
# The timestamps (seconds since the epoch) a datetime can hold:
# 0001-01-01 to 9999-12-31 23:59:59 UTC.
FIRST_DATETIME_SECONDS = -62135596800
LAST_DATETIME_SECONDS = 253402300799


@dataclasses.dataclass(frozen=True)
class TimestampSeconds:
    """A field-table timestamp outside the years a datetime can hold, kept as its
    seconds since the epoch so that it is passed on unchanged. It equals only a
    timestamp of the same seconds (not an integer), as datetimes do."""

    seconds: int


def timestamp_value(seconds):
    """The Python value of a field-table timestamp: an aware UTC datetime, or a
    L{TimestampSeconds} for one beyond the years 1-9999."""
    if FIRST_DATETIME_SECONDS <= seconds <= LAST_DATETIME_SECONDS:
        return _EPOCH + datetime.timedelta(seconds=seconds)
    return TimestampSeconds(seconds)


def dict_to_table(values, table=None):
    """Fills (or creates) a C{FieldTable} from a mapping of str to Python values."""
    if table is None:
        table = messages_pb2.FieldTable()
    for name, value in (values or {}).items():
        if not isinstance(name, str):
            raise TypeError(f"field table keys must be str, not {type(name).__name__}: {name!r}")
        field = table.fields.add()
        field.name = name
        _fill_value(field.value, value, name)
    return table


def table_to_dict(table):
    """The fields of a C{FieldTable} as an insertion-ordered dict."""
    return {field.name: value_to_python(field.value) for field in table.fields}


def _fill_value(target, value, where):
    if value is None:
        target.void_value.SetInParent()
    elif isinstance(value, bool):
        target.boolean_value = value
    elif isinstance(value, int):
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"integer field {where!r} is outside the signed 64-bit range: {value}")
        target.integer_value = value
    elif isinstance(value, float):
        target.double_value = value
    elif isinstance(value, str):
        target.string_value = value
    elif isinstance(value, (bytes, bytearray, memoryview)):
        target.bytes_value = bytes(value)
    elif isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        target.timestamp_value = int(value.timestamp())
    elif isinstance(value, TimestampSeconds):
        target.timestamp_value = value.seconds
    elif isinstance(value, decimal.Decimal):
        sign, digits, exponent = value.as_tuple()
        if not isinstance(exponent, int):
            raise ValueError(f"decimal field {where!r} must be finite: {value}")
        unscaled = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
        if exponent > 0:
            unscaled, exponent = unscaled * 10**exponent, 0
        target.decimal_value.scale = -exponent
        target.decimal_value.value = unscaled
    elif isinstance(value, dict):
        dict_to_table(value, target.table_value)
        target.table_value.SetInParent()
    elif isinstance(value, (list, tuple)):
        target.array_value.SetInParent()
        for index, item in enumerate(value):
            _fill_value(target.array_value.values.add(), item, f"{where}[{index}]")
    else:
        raise TypeError(
            f"field {where!r} has a type field tables cannot carry: {type(value).__name__}"
        )


def value_to_python(value):
    """The Python value of one C{FieldValue}; never fails, whatever the value holds."""
    kind = value.WhichOneof("kind")
    if kind is None or kind == "void_value":
        return None
    if kind == "table_value":
        return table_to_dict(value.table_value)
    if kind == "array_value":
        return [value_to_python(item) for item in value.array_value.values]
    if kind == "timestamp_value":
        return timestamp_value(value.timestamp_value)
    if kind == "decimal_value":
        return decimal_value(value.decimal_value.scale, value.decimal_value.value)
    return getattr(value, kind)


def decimal_value(scale, unscaled):
    """
    C{unscaled * 10 ** -scale} as an exact Decimal, for any scale (no context,
    so no rounding or overflow).
    """
    digits = tuple(map(int, str(abs(unscaled))))
    return decimal.Decimal((1 if unscaled < 0 else 0, digits, -scale))


def freeze(value):
    """A hashable, order-independent stand-in for a Python field value (dicts
    compare as sets of items), used to tell bindings and arguments apart."""
    if isinstance(value, dict):
        return frozenset((key, freeze(item)) for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return tuple(freeze(item) for item in value)
    if isinstance(value, (bytearray, memoryview)):
        value = bytes(value)
    return (type(value).__name__, value)  # keeps True apart from 1
