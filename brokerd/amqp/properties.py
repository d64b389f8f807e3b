"""AMQP 0-9-1 basic content-header properties and field tables, to and from protobuf.

Property bytes are what a content header frame carries after class-id, weight and
body-size: flag words (bit 0 set: another follows), then the present properties.
Field tables keep each value's AMQP type and their order, so they re-encode to the
same bytes. Precompiled structs and plain loops keep this cheap enough for every publish.
Tables and arrays nested deeper than L{MAX_TABLE_DEPTH} are refused while decoding (406,
naming the field), which also bounds the decoder's recursion.
"""

from struct import Struct
from struct import error as StructError

from brokerd.errors import FrameSyntaxError
from brokerd.model.property_rules import ARGUMENT, HEADER, table_too_deep
from brokerd.proto import messages_pb2
from brokerd.proto.tables import MAX_TABLE_DEPTH

_UINT8 = Struct(">B")
_UINT16 = Struct(">H")
_UINT32 = Struct(">I")
_INT64 = Struct(">q")  # also timestamps: read signed, any 8 bytes fit int64 and re-encode unchanged
_DECIMAL = Struct(">Bi")  # scale, then a signed value, as pika and pamqp's encoder write it

_SHORT_STRING, _TABLE, _OCTET, _TIMESTAMP = range(4)

# (flag bit, BasicProperties field, wire type) in wire order. cluster_id has no
# protobuf field: it is read past and dropped.
_PROPERTIES = (
    (0x8000, "content_type", _SHORT_STRING),
    (0x4000, "content_encoding", _SHORT_STRING),
    (0x2000, "headers", _TABLE),
    (0x1000, "delivery_mode", _OCTET),
    (0x0800, "priority", _OCTET),
    (0x0400, "correlation_id", _SHORT_STRING),
    (0x0200, "reply_to", _SHORT_STRING),
    (0x0100, "expiration", _SHORT_STRING),
    (0x0080, "message_id", _SHORT_STRING),
    (0x0040, "timestamp", _TIMESTAMP),
    (0x0020, "type", _SHORT_STRING),
    (0x0010, "user_id", _SHORT_STRING),
    (0x0008, "app_id", _SHORT_STRING),
    (0x0004, "cluster_id", _SHORT_STRING),
)
_WRITTEN_PROPERTIES = _PROPERTIES[:-1]

_Kind = messages_pb2.IntegerKind
# IntegerKind -> (tag, struct, smallest value, largest value)
_INTEGER_WRITERS = {
    _Kind.INT8: (ord("b"), Struct(">b"), -(2**7), 2**7 - 1),
    _Kind.UINT8: (ord("B"), Struct(">B"), 0, 2**8 - 1),
    _Kind.INT16: (ord("s"), Struct(">h"), -(2**15), 2**15 - 1),
    _Kind.UINT16: (ord("u"), Struct(">H"), 0, 2**16 - 1),
    _Kind.INT32: (ord("I"), Struct(">i"), -(2**31), 2**31 - 1),
    _Kind.UINT32: (ord("i"), Struct(">I"), 0, 2**32 - 1),
    _Kind.INT64: (ord("l"), _INT64, -(2**63), 2**63 - 1),
    _Kind.UINT64: (ord("L"), _INT64, -(2**63), 2**63 - 1),  # signed, as pamqp reads it
}
# FieldValue field -> (tag, struct) for the other fixed-size values
_NUMBER_WRITERS = {
    "double_value": (ord("d"), Struct(">d")),
    "float_value": (ord("f"), Struct(">f")),
    "timestamp_value": (ord("T"), _INT64),
}
# tag -> (struct, FieldValue field, IntegerKind or None) for every fixed-size number
_NUMBER_READERS = {
    **{
        tag: (packer, "integer_value", kind)
        for kind, (tag, packer, _, _) in _INTEGER_WRITERS.items()
    },
    **{tag: (packer, field, None) for field, (tag, packer) in _NUMBER_WRITERS.items()},
}
_BOOLEAN, _LONG_STRING, _BYTE_ARRAY, _TABLE_TAG, _ARRAY, _VOID, _DECIMAL_TAG = b"tSxFAVD"


class _Malformed(Exception):
    """A table or array that cannot be read; each enclosing container adds itself to C{path}."""

    def __init__(self, problem, where=None):
        super().__init__(problem)
        self.problem = problem
        self.path = [] if where is None else [where]  # innermost first
        self.name = None  # the outermost field's name, once known

    def describe(self, subject):
        where = f": {' in '.join(self.path)}" if self.path else ""
        return f"{subject}{where} {self.problem}"


class _TooDeep(_Malformed):
    """A table or array nested deeper than L{MAX_TABLE_DEPTH}: well-formed, but refused."""


def decode_properties(data, offset=0):
    """The C{BasicProperties} in the flag words and property list at C{data[offset:]}.

    Raises L{FrameSyntaxError}, which closes the connection, if the bytes are malformed,
    and L{PreconditionFailed}, which closes the channel, if headers nest too deep.
    """
    properties = messages_pb2.BasicProperties()
    size = len(data)
    name = "flags"
    try:
        flags = word = _UINT16.unpack_from(data, offset)[0]
        offset += 2
        while word & 1:  # another flag word follows; those name no basic property
            word = _UINT16.unpack_from(data, offset)[0]
            offset += 2
        for flag, name, wire_type in _PROPERTIES:
            if not flags & flag:
                continue
            if wire_type == _SHORT_STRING:
                end = offset + 1 + data[offset]
                if end > size:
                    raise IndexError(name)  # reported as truncated below
                text = str(data[offset + 1 : end], "utf-8")
                offset = end
                if name != "cluster_id":
                    setattr(properties, name, text)
            elif wire_type == _OCTET:
                setattr(properties, name, data[offset])
                offset += 1
            elif wire_type == _TABLE:
                properties.headers.SetInParent()
                offset = _read_table(data, offset, size, properties.headers.fields, 1)
            else:
                properties.timestamp = _INT64.unpack_from(data, offset)[0]
                offset += 8
    except (IndexError, StructError):
        raise FrameSyntaxError(f"content header property {name} is truncated") from None
    except UnicodeDecodeError:
        raise FrameSyntaxError(f"content header property {name} is not valid UTF-8") from None
    except _TooDeep as too_deep:
        raise table_too_deep(HEADER, too_deep.name) from None
    except _Malformed as malformed:
        raise FrameSyntaxError(malformed.describe(f"content header property {name}")) from None
    return properties


def encode_properties(properties):
    """The flag word and property list for C{properties} (whose C{id} and C{routing_key} are
    not AMQP properties), as pamqp writes them except that present empty strings are kept.

    Raises ValueError if a value does not fit its AMQP type.
    """
    flags = 0
    parts = [b""]  # the flag word goes first
    for flag, name, wire_type in _WRITTEN_PROPERTIES:
        if name == "delivery_mode":
            if not properties.delivery_mode:  # the protobuf enum's 0 means absent
                continue
        elif not properties.HasField(name):
            continue
        value = getattr(properties, name)
        if wire_type == _SHORT_STRING:
            encoded = value.encode()
            if len(encoded) > 255:
                raise ValueError(
                    f"content header property {name} is longer than 255 bytes: {value[:40]!r}"
                )
            parts.append(_UINT8.pack(len(encoded)) + encoded)
        elif wire_type == _OCTET:
            if not 0 <= value <= 255:
                raise ValueError(f"content header property {name} is not an octet: {value}")
            parts.append(_UINT8.pack(value))
        elif wire_type == _TABLE:
            parts.append(encode_table(value))
        else:
            parts.append(_INT64.pack(value))
        flags |= flag
    parts[0] = _UINT16.pack(flags)
    return b"".join(parts)


def decode_table(data, offset=0, kind=ARGUMENT):
    """The C{FieldTable} whose 4-byte length starts at C{data[offset]}, and the offset after it.

    Raises L{FrameSyntaxError} if the table is malformed, and L{PreconditionFailed}
    naming the field as a C{kind} (L{ARGUMENT} or L{HEADER}) if it nests too deep.
    """
    table = messages_pb2.FieldTable()
    try:
        offset = _read_table(data, offset, len(data), table.fields, 1)
    except (IndexError, StructError):
        raise FrameSyntaxError("field table is truncated") from None
    except _TooDeep as too_deep:
        raise table_too_deep(kind, too_deep.name) from None
    except _Malformed as malformed:
        raise FrameSyntaxError(malformed.describe("field table")) from None
    return table, offset


def _read_length(data, offset, limit):
    """The start and end of the bytes after the 4-byte length at C{offset}."""
    length = _UINT32.unpack_from(data, offset)[0]
    offset += 4
    if offset + length > limit:
        raise _Malformed(f"has length {length} but only {limit - offset} bytes follow")
    return offset, offset + length


def _read_table(data, offset, limit, fields, depth):
    """
    Reads the table at C{offset} (nested C{depth} levels deep, the outermost
    being 1) into C{fields}.
    """
    offset, end = _read_length(data, offset, limit)
    while offset < end:
        name_end = offset + 1 + data[offset]
        if name_end > end:
            raise _Malformed("has a field name running past its end")
        try:
            name = str(data[offset + 1 : name_end], "utf-8")
        except UnicodeDecodeError:
            raw = bytes(data[offset + 1 : name_end])
            raise _Malformed(f"has a field name that is not valid UTF-8: {raw!r}") from None
        field = fields.add()
        field.name = name
        try:
            offset = _read_value(data, name_end, end, field.value, depth)
            if offset > end:
                raise _Malformed("runs past the end of its table")
        except (IndexError, StructError):
            raise _Malformed("is truncated", f"field {name!r}") from None
        except _Malformed as malformed:
            malformed.path.append(f"field {name!r}")
            malformed.name = name
            raise
    return end


def _read_array(data, offset, limit, values, depth):
    offset, end = _read_length(data, offset, limit)
    index = 0
    while offset < end:
        try:
            offset = _read_value(data, offset, end, values.add(), depth)
            if offset > end:
                raise _Malformed("runs past the end of its array")
        except (IndexError, StructError):
            raise _Malformed("is truncated", f"item {index}") from None
        except _Malformed as malformed:
            malformed.path.append(f"item {index}")
            raise
        index += 1
    return end


def _read_value(data, offset, limit, value, depth):
    """Fills C{value} from the tagged value at C{offset}, in a table or array C{depth} levels deep;
    returns the offset past it."""
    tag = data[offset]
    offset += 1
    number = _NUMBER_READERS.get(tag)
    if number is not None:
        reader, field, kind = number
        setattr(value, field, reader.unpack_from(data, offset)[0])
        if kind:  # INT64, the default, is 0
            value.integer_kind = kind
        return offset + reader.size
    if tag == _LONG_STRING or tag == _BYTE_ARRAY:
        start, offset = _read_length(data, offset, limit)
        raw = data[start:offset]
        if tag == _BYTE_ARRAY:
            value.bytes_value = bytes(raw)
        else:
            try:
                value.string_value = str(raw, "utf-8")
            except UnicodeDecodeError:
                value.bytes_value = bytes(raw)
                value.long_string_bytes = True
        return offset
    if tag == _BOOLEAN:
        value.boolean_value = data[offset] != 0
        return offset + 1
    if tag == _TABLE_TAG:
        if depth >= MAX_TABLE_DEPTH:
            raise _TooDeep("nests too deep")
        table = value.table_value
        table.SetInParent()
        return _read_table(data, offset, limit, table.fields, depth + 1)
    if tag == _ARRAY:
        if depth >= MAX_TABLE_DEPTH:
            raise _TooDeep("nests too deep")
        array = value.array_value
        array.SetInParent()
        return _read_array(data, offset, limit, array.values, depth + 1)
    if tag == _VOID:
        value.void_value.SetInParent()
        return offset
    if tag == _DECIMAL_TAG:
        decimal = value.decimal_value
        decimal.SetInParent()
        decimal.scale, decimal.value = _DECIMAL.unpack_from(data, offset)
        return offset + _DECIMAL.size
    raise _Malformed(f"has unknown type {bytes((tag,))!r}")


def encode_table(table):
    """The AMQP encoding of C{table}: a 4-byte length, then the fields in order with their types.

    Raises ValueError if a name or value does not fit its AMQP type.
    """
    out = bytearray()
    _write_table(out, table)
    return bytes(out)


def _write_table(out, table):
    start = len(out)
    out += b"\0\0\0\0"
    for field in table.fields:
        name = field.name
        encoded = name.encode()
        if len(encoded) > 255:
            raise ValueError(f"field name {name[:40]!r}... is longer than 255 bytes")
        out.append(len(encoded))
        out += encoded
        _write_value(out, field.value, name)
    _UINT32.pack_into(out, start, len(out) - start - 4)


def _write_value(out, value, name):
    kind = value.WhichOneof("kind")
    if kind == "integer_value":
        writer = _INTEGER_WRITERS.get(value.integer_kind)
        if writer is None:
            raise ValueError(f"field {name!r} has unknown integer kind {value.integer_kind}")
        tag, packer, smallest, largest = writer
        number = value.integer_value
        if not smallest <= number <= largest:
            kind_name = _Kind.Name(value.integer_kind)
            raise ValueError(f"field {name!r}: {number} does not fit integer kind {kind_name}")
        out.append(tag)
        out += packer.pack(number)
    elif kind == "string_value" or kind == "bytes_value":
        if kind == "string_value":
            raw, tag = value.string_value.encode(), _LONG_STRING
        else:
            raw, tag = value.bytes_value, _LONG_STRING if value.long_string_bytes else _BYTE_ARRAY
        out.append(tag)
        out += _UINT32.pack(len(raw))
        out += raw
    elif kind == "boolean_value":
        out.append(_BOOLEAN)
        out.append(value.boolean_value)
    elif kind == "table_value":
        out.append(_TABLE_TAG)
        _write_table(out, value.table_value)
    elif kind == "array_value":
        out.append(_ARRAY)
        start = len(out)
        out += b"\0\0\0\0"
        for index, item in enumerate(value.array_value.values):
            _write_value(out, item, f"{name}[{index}]")
        _UINT32.pack_into(out, start, len(out) - start - 4)
    elif kind == "decimal_value":
        decimal = value.decimal_value
        if not (decimal.scale <= 255 and -(2**31) <= decimal.value < 2**31):
            fits = "an octet scale and a signed 32-bit value"
            raise ValueError(
                f"field {name!r}: decimal scale {decimal.scale}, value {decimal.value}"
                f" do not fit {fits}"
            )
        out.append(_DECIMAL_TAG)
        out += _DECIMAL.pack(decimal.scale, decimal.value)
    elif kind is None or kind == "void_value":
        out.append(_VOID)
    else:
        tag, packer = _NUMBER_WRITERS[kind]
        out.append(tag)
        out += packer.pack(getattr(value, kind))
