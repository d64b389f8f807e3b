"""Method arguments that carry field tables, decoded in one linear pass.

pamqp decodes a field table by slicing off the rest of the frame for every
value, which costs time quadratic in the table's size; a client could stall the
broker with one frame of many small values. The methods that carry a table
(connection.start-ok, exchange and queue declare, bind and unbind,
basic.consume) are decoded here instead, by offsets into the frame, into exactly
the Python values pamqp produces (str or bytes, bytearray, Decimal, aware
datetime, ...), so nothing after decoding can tell the difference. Every other
method is still decoded by pamqp.

Each declared length is checked against the bytes that are really there, and
tables and arrays may nest at most L{MAX_TABLE_DEPTH} levels (the method's own
table counts as 1), which also bounds the recursion.
"""

import datetime
import decimal
from struct import Struct

from pamqp import commands

from brokerd.errors import FrameSyntaxError, MethodNotImplemented
from brokerd.proto.tables import MAX_TABLE_DEPTH

_OCTET = Struct(">B")
_SHORT = Struct(">H")
_LONG = Struct(">I")
_LONG_LONG = Struct(">q")
_DECIMAL = Struct(">Bi")  # scale, then a signed value, as pamqp reads it
_TIMESTAMP = Struct(">Q")
_LARGEST_SECONDS = 0xFFFFFFFF  # pamqp reads a larger timestamp as milliseconds

# tag -> struct for the field values that are one fixed-size number
_NUMBERS = {
    ord("b"): Struct(">b"),
    ord("B"): Struct(">B"),
    ord("s"): Struct(">h"),
    ord("u"): Struct(">H"),
    ord("I"): Struct(">i"),
    ord("i"): Struct(">I"),
    ord("l"): _LONG_LONG,
    ord("L"): _LONG_LONG,  # signed, as pamqp reads it
    ord("f"): Struct(">f"),
    ord("d"): Struct(">d"),
}
_BOOLEAN, _LONG_STRING, _BYTE_ARRAY, _TABLE, _ARRAY, _TIMESTAMP_TAG, _DECIMAL_TAG = b"tSxFATD"
_VOIDS = frozenset(b"V\x00")  # pamqp also reads a zero tag as void


class Malformed(Exception):
    """Bytes that do not decode: a length running past its container, an unknown type, bad UTF-8."""


class Unacceptable(Exception):
    """Bytes that decode but are refused: nesting too deep, a value Python cannot hold."""


def decode_table_fields(data, start, end, depth=1):
    """
    The dict of the field-table entries in C{data[start:end]} (a table without
    its 4-byte length, as an AMQPLAIN response carries it), keyed and valued as
    pamqp decodes them. C{depth} is the table's nesting level.

    Raises L{Malformed} or L{Unacceptable} naming the entry at fault.
    """
    table = {}
    offset = start
    while offset < end:
        name_end = offset + 1 + data[offset]
        if name_end > end:
            raise Malformed(
                f"has a field name of {data[offset]} bytes running past the end of its table"
            )
        try:
            name = str(data[offset + 1 : name_end], "utf-8")
        except UnicodeDecodeError:
            raise Malformed(
                "has a field name that is not valid UTF-8:"
                f" {bytes(data[offset + 1 : name_end])!r}"
            ) from None
        if name_end >= end:
            raise Malformed(f"field {name!r} has no value")
        try:
            offset, table[name] = _read_value(data, name_end, end, depth)
        except (Malformed, Unacceptable) as problem:
            if depth == 1:  # name the top-level entry only: a deep path would not fit a reply text
                raise type(problem)(f"field {name!r} {problem}") from None
            raise
    return table


def _read_length(data, offset, end, what):
    """The start and end of the C{what} whose 4-byte length is at C{offset}."""
    if offset + 4 > end:
        raise Malformed(f"has {what} whose length is cut off")
    length = _LONG.unpack_from(data, offset)[0]
    offset += 4
    if length > end - offset:
        raise Malformed(f"has {what} of {length} bytes but only {end - offset} bytes follow")
    return offset, offset + length


def _read_array(data, offset, end, depth):
    values = []
    while offset < end:
        offset, value = _read_value(data, offset, end, depth)
        values.append(value)
    return values


def _read_value(data, offset, end, depth):
    """The C{(offset after, value)} of the tagged value at C{offset}, which must end by C{end}."""
    tag = data[offset]
    offset += 1
    number = _NUMBERS.get(tag)
    if number is not None:
        after = offset + number.size
        if after > end:
            raise Malformed(f"has a {bytes((tag,)).decode()!r} value cut off")
        return after, number.unpack_from(data, offset)[0]
    if tag in _VOIDS:
        return offset, None
    if tag == _LONG_STRING:
        start, offset = _read_length(data, offset, end, "a long string")
        raw = data[start:offset]
        try:
            return offset, str(raw, "utf-8")
        except UnicodeDecodeError:
            return offset, bytes(raw)
    if tag == _TABLE or tag == _ARRAY:
        what = "a table" if tag == _TABLE else "an array"
        if depth >= MAX_TABLE_DEPTH:
            raise Unacceptable(f"nests tables and arrays deeper than {MAX_TABLE_DEPTH} levels")
        start, offset = _read_length(data, offset, end, what)
        if tag == _TABLE:
            return offset, decode_table_fields(data, start, offset, depth + 1)
        return offset, _read_array(data, start, offset, depth + 1)
    if tag == _BOOLEAN:
        if offset >= end:
            raise Malformed("has a boolean value cut off")
        return offset + 1, data[offset] != 0
    if tag == _BYTE_ARRAY:
        start, offset = _read_length(data, offset, end, "a byte array")
        return offset, bytearray(data[start:offset])
    if tag == _TIMESTAMP_TAG:
        if offset + 8 > end:
            raise Malformed("has a timestamp value cut off")
        return offset + 8, _timestamp(_TIMESTAMP.unpack_from(data, offset)[0])
    if tag == _DECIMAL_TAG:
        if offset + _DECIMAL.size > end:
            raise Malformed("has a decimal value cut off")
        scale, value = _DECIMAL.unpack_from(data, offset)
        return offset + _DECIMAL.size, decimal.Decimal(value) * (decimal.Decimal(10) ** -scale)
    raise Malformed(f"has a value of unknown type {bytes((tag,))!r}")


def _timestamp(seconds):
    """An aware UTC datetime, as pamqp makes it (values above 2^32 are milliseconds)."""
    if seconds > _LARGEST_SECONDS:
        seconds /= 1000.0
    try:
        return datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    except (OverflowError, ValueError, OSError):
        raise Unacceptable(
            f"has a timestamp {seconds:.0f} s past 1970, beyond the years 1-9999"
        ) from None


# -- whole methods


def _argument_types(method_class):
    return tuple((name, method_class.amqp_type(name)) for name in method_class.__slots__)


# method index -> (pamqp class, ((argument, AMQP type), ...)) for the methods that carry a table
TABLE_METHODS = {
    index: (method_class, _argument_types(method_class))
    for index, method_class in commands.INDEX_MAPPING.items()
    if "table" in (method_class.amqp_type(name) for name in method_class.__slots__)
}
_FIXED = {"octet": _OCTET, "short": _SHORT, "long": _LONG, "longlong": _LONG_LONG}


def decode_method(index, data, start, end, refusal):
    """
    The pamqp method whose index is C{index} and whose arguments are
    C{data[start:end]}.

    Bytes that do not decode raise L{FrameSyntaxError} (502, the connection
    closes); a table nested too deep or holding a value Python cannot hold
    raises C{refusal} (a channel method's caller passes
    L{brokerd.errors.PreconditionFailed}, which closes only the channel).
    """
    described = TABLE_METHODS.get(index)
    if described is None:
        method_class = commands.INDEX_MAPPING.get(index)
        if method_class is None:
            raise MethodNotImplemented(f"unknown method class {index >> 16} id {index & 0xFFFF}")
        method = method_class()
        try:
            method.unmarshal(bytes(data[start:end]))
        except Exception as problem:
            raise FrameSyntaxError(
                f"{method_class.name} arguments cannot be decoded: {problem}"
            ) from None
        return method
    method_class, arguments = described
    method = method_class()
    try:
        _unmarshal(method, arguments, data, start, end)
    except _ArgumentError as failed:
        where = f"{method_class.name.lower()} {failed.argument}"
        if isinstance(failed.problem, Unacceptable):
            raise refusal(f"{where} {failed.problem}") from None
        raise FrameSyntaxError(f"{where} {failed.problem}") from None
    return method


class _ArgumentError(Exception):
    """A L{Malformed} or L{Unacceptable} problem in the method argument named C{argument}."""

    def __init__(self, argument, problem):
        super().__init__(argument, problem)
        self.argument = argument
        self.problem = problem


def _unmarshal(method, arguments, data, offset, end):
    """
    Sets C{method}'s arguments from C{data[offset:end]} the way pamqp's
    C{Frame.unmarshal} does.
    """
    bit = 8  # the position of the next bit in the current octet; 8: start a new octet
    bits = 0
    for name, kind in arguments:
        try:
            if kind == "bit":
                if bit == 8:
                    if offset >= end:
                        raise Malformed("is cut off")
                    bits = data[offset]
                    offset += 1
                    bit = 0
                setattr(method, name, bool(bits >> bit & 1))
                bit += 1
                continue
            bit = 8
            offset = _read_argument(method, name, kind, data, offset, end)
        except (Malformed, Unacceptable) as problem:
            raise _ArgumentError(name, problem) from None


def _read_argument(method, name, kind, data, offset, end):
    """Sets the one non-bit argument C{name} of AMQP type C{kind}; returns the offset after it."""
    packer = _FIXED.get(kind)
    if packer is not None:
        if offset + packer.size > end:
            raise Malformed("is cut off")
        setattr(method, name, packer.unpack_from(data, offset)[0])
        return offset + packer.size
    if kind == "shortstr":
        if offset >= end or offset + 1 + data[offset] > end:
            raise Malformed("is cut off")
        after = offset + 1 + data[offset]
        try:
            setattr(method, name, str(data[offset + 1 : after], "utf-8"))
        except UnicodeDecodeError:
            raise Malformed("is not valid UTF-8") from None
        return after
    if kind == "longstr":
        start, offset = _read_length(data, offset, end, "a long string")
        raw = data[start:offset]
        try:
            setattr(method, name, str(raw, "utf-8"))
        except UnicodeDecodeError:
            setattr(method, name, bytes(raw))
        return offset
    start, offset = _read_length(data, offset, end, "a table")  # the only other type: table
    setattr(method, name, decode_table_fields(data, start, offset))
    return offset
