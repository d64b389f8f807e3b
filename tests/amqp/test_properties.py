"""The content-header property and field-table codec, checked against pamqp byte for byte."""

import datetime
import decimal
import struct

import pytest
from pamqp import commands, header
from pamqp import decode as pamqp_decode
from pamqp import encode as pamqp_encode

from brokerd.amqp.properties import (
    decode_properties,
    decode_table,
    encode_properties,
    encode_table,
)
from brokerd.errors import FrameSyntaxError
from brokerd.proto import messages_pb2
from brokerd.proto.tables import dict_to_table, table_to_dict

Kind = messages_pb2.IntegerKind
WHEN = datetime.datetime(2026, 11, 22, 3, 0, tzinfo=datetime.timezone.utc)


def pamqp_bytes(**properties):
    """What pamqp writes for these properties: flag words and property list."""
    return commands.Basic.Properties(**properties).marshal()


def table_bytes(*fields):
    """A field table from (name, tag, encoded value) triples."""
    body = b"".join(bytes((len(name),)) + name + tag + value for name, tag, value in fields)
    return struct.pack(">I", len(body)) + body


def long_bytes(raw):
    return struct.pack(">I", len(raw)) + raw


def headers_property(table):
    """Property bytes carrying only the encoded C{table} as headers."""
    return b"\x20\x00" + table


def value(**fields):
    return messages_pb2.FieldValue(**fields)


def integer(number, kind):
    return value(integer_value=number, integer_kind=kind)


def table(**values):
    """A FieldTable from FieldValues, in keyword order."""
    return messages_pb2.FieldTable(fields=[messages_pb2.Field(name=k, value=v) for k, v in values.items()])


# (pamqp keyword arguments, the BasicProperties they decode to), one per property.
SINGLE_PROPERTIES = [
    ({"content_type": "application/json"}, {"content_type": "application/json"}),
    ({"content_type": "tëxt/ünïcode"}, {"content_type": "tëxt/ünïcode"}),
    ({"content_type": "x" * 255}, {"content_type": "x" * 255}),
    ({"content_encoding": "gzip"}, {"content_encoding": "gzip"}),
    ({"headers": {}}, {"headers": table()}),
    (
        {"headers": {"a": "text", "b": 1, "c": -300, "d": [True, None], "e": {"f": bytearray(b"\xff")}}},
        {"headers": table(
            a=value(string_value="text"),
            b=integer(1, Kind.INT8),
            c=integer(-300, Kind.INT16),
            d=value(array_value=messages_pb2.FieldArray(values=[value(boolean_value=True), value(void_value={})])),
            e=value(table_value=table(f=value(bytes_value=b"\xff"))),
        )},
    ),
    ({"delivery_mode": 1}, {"delivery_mode": messages_pb2.TRANSIENT}),
    ({"delivery_mode": 2}, {"delivery_mode": messages_pb2.PERSISTENT}),
    ({"priority": 0}, {"priority": 0}),
    ({"priority": 9}, {"priority": 9}),
    ({"priority": 255}, {"priority": 255}),
    ({"correlation_id": "c-1"}, {"correlation_id": "c-1"}),
    ({"reply_to": "amq.rabbitmq.reply-to"}, {"reply_to": "amq.rabbitmq.reply-to"}),
    ({"expiration": "60000"}, {"expiration": "60000"}),
    ({"message_id": "m-1"}, {"message_id": "m-1"}),
    ({"timestamp": WHEN}, {"timestamp": int(WHEN.timestamp())}),
    ({"message_type": "order.created"}, {"type": "order.created"}),
    ({"user_id": "guest"}, {"user_id": "guest"}),
    ({"app_id": "billing"}, {"app_id": "billing"}),
]
ALL_PAMQP = {k: v for pamqp_kwargs, _ in SINGLE_PROPERTIES for k, v in pamqp_kwargs.items()}
ALL_PROTOBUF = {k: v for _, pb_kwargs in SINGLE_PROPERTIES for k, v in pb_kwargs.items()}
CASES = [*SINGLE_PROPERTIES, (ALL_PAMQP, ALL_PROTOBUF)]
CASE_IDS = [",".join(pamqp_kwargs) for pamqp_kwargs, _ in SINGLE_PROPERTIES] + ["all"]


@pytest.mark.parametrize(("pamqp_kwargs", "pb_kwargs"), CASES, ids=CASE_IDS)
def test_encodes_each_property_as_pamqp_does(pamqp_kwargs, pb_kwargs):
    properties = messages_pb2.BasicProperties(**pb_kwargs)
    assert encode_properties(properties) == pamqp_bytes(**pamqp_kwargs)


@pytest.mark.parametrize(("pamqp_kwargs", "pb_kwargs"), CASES, ids=CASE_IDS)
def test_decodes_what_pamqp_encodes(pamqp_kwargs, pb_kwargs):
    decoded = decode_properties(pamqp_bytes(**pamqp_kwargs))
    assert decoded == messages_pb2.BasicProperties(**pb_kwargs)
    assert {field.name for field, _ in decoded.ListFields()} == set(pb_kwargs)


@pytest.mark.parametrize(("pamqp_kwargs", "pb_kwargs"), CASES, ids=CASE_IDS)
def test_pamqp_decodes_what_we_encode(pamqp_kwargs, pb_kwargs):
    encoded = encode_properties(messages_pb2.BasicProperties(**pb_kwargs))
    content_header = header.ContentHeader()
    content_header.unmarshal(struct.pack(">HHQ", 60, 0, 0) + encoded)
    assert content_header.properties == commands.Basic.Properties(**pamqp_kwargs)


def test_no_properties_is_a_zero_flag_word():
    assert encode_properties(messages_pb2.BasicProperties()) == b"\x00\x00" == pamqp_bytes()
    assert decode_properties(b"\x00\x00") == messages_pb2.BasicProperties()


def test_id_and_routing_key_are_not_amqp_properties():
    properties = messages_pb2.BasicProperties(id="42", routing_key="orders", app_id="a")
    assert encode_properties(properties) == pamqp_bytes(app_id="a")


def test_present_empty_strings_stay_apart_from_absent():
    decoded = decode_properties(b"\x80\x00\x00")
    assert decoded.HasField("content_type") and decoded.content_type == ""
    assert not decoded.HasField("content_encoding")
    # pamqp leaves empty strings out; a broker passes on what it was given.
    assert encode_properties(decoded) == b"\x80\x00\x00"


def test_empty_headers_are_present_after_decoding():
    decoded = decode_properties(pamqp_bytes(headers={}))
    assert decoded.HasField("headers") and len(decoded.headers.fields) == 0
    assert not decode_properties(pamqp_bytes(app_id="a")).HasField("headers")


def test_cluster_id_is_read_past_and_dropped():
    data = b"\x10\x0c" + b"\x02" + b"\x05" + b"app-1" + b"\x02c1"  # delivery_mode, app_id, cluster_id
    decoded = decode_properties(data)
    assert decoded == messages_pb2.BasicProperties(delivery_mode=messages_pb2.PERSISTENT, app_id="app-1")
    assert encode_properties(decoded) == data[:-3].replace(b"\x0c", b"\x08", 1)


def test_continuation_flag_words_are_read_past():
    data = b"\x90\x01\x00\x00" + b"\x04text" + b"\x02"
    decoded = decode_properties(data)
    assert decoded == messages_pb2.BasicProperties(content_type="text", delivery_mode=messages_pb2.PERSISTENT)


def test_offset_and_memoryview():
    data = b"\xff" * 12 + pamqp_bytes(content_type="a", headers={"k": "v"}, delivery_mode=2)
    decoded = decode_properties(memoryview(data), 12)
    assert decoded.content_type == "a" and table_to_dict(decoded.headers) == {"k": "v"}
    assert decoded.delivery_mode == 2
    encoded = table_bytes((b"k", b"S", long_bytes(b"v")))
    parsed, end = decode_table(memoryview(b"xy" + encoded + b"rest"), 2)
    assert table_to_dict(parsed) == {"k": "v"} and end == 2 + len(encoded)


# (name, tag, encoded value, the FieldValue it decodes to): every AMQP field type.
FIELD_VALUES = [
    ("true", b"t", b"\x01", value(boolean_value=True)),
    ("false", b"t", b"\x00", value(boolean_value=False)),
    ("int8-min", b"b", b"\x80", integer(-128, Kind.INT8)),
    ("int8-max", b"b", b"\x7f", integer(127, Kind.INT8)),
    ("uint8-max", b"B", b"\xff", integer(255, Kind.UINT8)),
    ("int16-min", b"s", b"\x80\x00", integer(-32768, Kind.INT16)),
    ("int16-max", b"s", b"\x7f\xff", integer(32767, Kind.INT16)),
    ("uint16-max", b"u", b"\xff\xff", integer(65535, Kind.UINT16)),
    ("int32-min", b"I", b"\x80\x00\x00\x00", integer(-(2**31), Kind.INT32)),
    ("int32-max", b"I", b"\x7f\xff\xff\xff", integer(2**31 - 1, Kind.INT32)),
    ("uint32-max", b"i", b"\xff\xff\xff\xff", integer(2**32 - 1, Kind.UINT32)),
    ("int64-min", b"l", b"\x80" + b"\x00" * 7, integer(-(2**63), Kind.INT64)),
    ("int64-max", b"l", b"\x7f" + b"\xff" * 7, integer(2**63 - 1, Kind.INT64)),
    ("int64-minus-one", b"l", b"\xff" * 8, integer(-1, Kind.INT64)),
    ("uint64-all-ones", b"L", b"\xff" * 8, integer(-1, Kind.UINT64)),
    ("uint64-max-signed", b"L", b"\x7f" + b"\xff" * 7, integer(2**63 - 1, Kind.UINT64)),
    ("float", b"f", struct.pack(">f", -1.5), value(float_value=-1.5)),
    ("double", b"d", struct.pack(">d", 0.1), value(double_value=0.1)),
    ("decimal", b"D", struct.pack(">Bi", 2, 1234), value(decimal_value={"scale": 2, "value": 1234})),
    ("decimal-negative", b"D", struct.pack(">Bi", 3, -(2**31)), value(decimal_value={"scale": 3, "value": -(2**31)})),
    ("decimal-zero", b"D", b"\x00" * 5, value(decimal_value={})),
    ("string", b"S", long_bytes("héllo".encode()), value(string_value="héllo")),
    ("empty-string", b"S", long_bytes(b""), value(string_value="")),
    ("long-string-bytes", b"S", long_bytes(b"\xff\xfe\x00"),
     value(bytes_value=b"\xff\xfe\x00", long_string_bytes=True)),
    ("byte-array", b"x", long_bytes(b"\x00\xff"), value(bytes_value=b"\x00\xff")),
    ("empty-byte-array", b"x", long_bytes(b""), value(bytes_value=b"")),
    ("timestamp", b"T", struct.pack(">Q", 1_700_000_000), value(timestamp_value=1_700_000_000)),
    ("void", b"V", b"", value(void_value={})),
    ("empty-table", b"F", table_bytes(), value(table_value={})),
    ("empty-array", b"A", long_bytes(b""), value(array_value={})),
    (
        "nested-table",
        b"F",
        table_bytes((b"inner", b"F", table_bytes((b"n", b"u", b"\x00\x07"), (b"v", b"V", b""))), (b"z", b"t", b"\x01")),
        value(table_value=table(
            inner=value(table_value=table(n=integer(7, Kind.UINT16), v=value(void_value={}))),
            z=value(boolean_value=True),
        )),
    ),
    (
        "nested-array",
        b"A",
        long_bytes(b"b\xff" + b"A" + long_bytes(b"S" + long_bytes(b"s")) + b"F" + table_bytes((b"k", b"V", b""))),
        value(array_value=messages_pb2.FieldArray(values=[
            integer(-1, Kind.INT8),
            value(array_value=messages_pb2.FieldArray(values=[value(string_value="s")])),
            value(table_value=table(k=value(void_value={}))),
        ])),
    ),
]


@pytest.mark.parametrize(("name", "tag", "encoded", "expected"), FIELD_VALUES, ids=[c[0] for c in FIELD_VALUES])
def test_every_field_type_round_trips_byte_exactly(name, tag, encoded, expected):
    data = table_bytes((name.encode(), tag, encoded), (b"after", b"t", b"\x01"))
    decoded, end = decode_table(data)
    assert end == len(data)
    assert decoded == table(**{name: expected, "after": value(boolean_value=True)})
    assert decoded.fields[0].value.WhichOneof("kind") == expected.WhichOneof("kind")
    assert encode_table(decoded) == data
    properties = decode_properties(headers_property(data))
    assert properties.headers == decoded
    assert encode_properties(properties) == headers_property(data)


def test_every_field_type_in_one_table_round_trips():
    data = table_bytes(*((name.encode(), tag, encoded) for name, tag, encoded, _ in FIELD_VALUES))
    assert encode_table(decode_table(data)[0]) == data
    assert encode_properties(decode_properties(headers_property(data))) == headers_property(data)


PYTHON_VALUES = {
    "text": "héllo",
    "int": 5,
    "negative": -(2**63),
    "big": 2**63 - 1,
    "double": 0.1,
    "yes": True,
    "nothing": None,
    "when": WHEN,
    "money": decimal.Decimal("12.34"),
    "nested": {"inner": {"deep": [1, "two", None]}},
    "list": [1, 2.5, "three", [4], {"five": 5}],
}


def test_dict_to_table_values_encode_with_their_default_types():
    encoded = encode_table(dict_to_table({"i": 1, "s": "a", "b": b"\x00", "d": 0.5}))
    assert encoded == table_bytes(
        (b"i", b"l", struct.pack(">q", 1)),
        (b"s", b"S", long_bytes(b"a")),
        (b"b", b"x", long_bytes(b"\x00")),
        (b"d", b"d", struct.pack(">d", 0.5)),
    )


def test_pamqp_decodes_what_encode_table_writes():
    values = {**PYTHON_VALUES, "raw": b"\x00\xff"}
    encoded = encode_table(dict_to_table(values))
    consumed, decoded = pamqp_decode.field_table(encoded)
    assert consumed == len(encoded)
    assert decoded == {**values, "raw": bytearray(b"\x00\xff")}
    assert table_to_dict(decode_table(encoded)[0]) == values


def test_decodes_what_pamqp_encodes_and_re_encodes_it_unchanged():
    values = {
        **PYTHON_VALUES,
        "raw": bytearray(b"\x00\xff"),
        "money": decimal.Decimal("-12.34"),  # pamqp writes the value signed
        "double": 2.5,  # pamqp writes Python floats as 32-bit 'f': pick one that fits
        "widths": [-129, 40000, -(2**31), 2**32 - 1, 2**40],
    }
    encoded = pamqp_encode.field_table(values)
    decoded, end = decode_table(encoded)
    assert end == len(encoded)
    assert table_to_dict(decoded) == {**values, "raw": b"\x00\xff"}
    assert encode_table(decoded) == encoded


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "content header property flags is truncated"),
        (b"\x80", "content header property flags is truncated"),
        (b"\x00\x01", "content header property flags is truncated"),
        (b"\x80\x00\x05abc", "content header property content_type is truncated"),
        (b"\x80\x00\x02\xff\xfe", "content header property content_type is not valid UTF-8"),
        (b"\x08\x00", "content header property priority is truncated"),
        (b"\x00\x40\x00\x00\x00", "content header property timestamp is truncated"),
        (b"\x20\x00\x00\x00", "content header property headers is truncated"),
        (
            headers_property(table_bytes((b"x-a", b"Z", b""))),
            r"content header property headers: field 'x-a' has unknown type b'Z'",
        ),
        (b"\x20\x00\x00\x00\x00\x64\x01", "content header property headers has length 100 but only 1 bytes follow"),
        (
            headers_property(table_bytes((b"\xff", b"V", b""))),
            r"content header property headers has a field name that is not valid UTF-8: b'\\xff'",
        ),
        (headers_property(b"\x00\x00\x00\x02\x05a"), "content header property headers has a field name running past"),
        (
            headers_property(table_bytes((b"n", b"I", b"\x00\x00"))),
            "content header property headers: field 'n' is truncated",
        ),
        (
            headers_property(table_bytes((b"n", b"I", b"\x00\x00")) + b"\x00\x00"),
            "content header property headers: field 'n' runs past the end of its table",
        ),
        (
            headers_property(table_bytes((b"s", b"S", b"\x00\x00\x00\x64ab"))),
            "content header property headers: field 's' has length 100 but only 2 bytes follow",
        ),
        (
            headers_property(table_bytes((b"a", b"A", long_bytes(b"F" + table_bytes((b"b", b"\x00", b"")))))),
            r"content header property headers: field 'b' in item 0 in field 'a' has unknown type b'\\x00'",
        ),
        (
            headers_property(table_bytes((b"a", b"A", long_bytes(b"V" + b"t")))),
            r"content header property headers: item 1 in field 'a' is truncated",
        ),
    ],
)
def test_malformed_properties_raise_frame_syntax_errors(data, message):
    with pytest.raises(FrameSyntaxError, match=message) as caught:
        decode_properties(data)
    assert caught.value.reply_code == 502


def test_malformed_tables_raise_frame_syntax_errors():
    with pytest.raises(FrameSyntaxError, match="field table is truncated"):
        decode_table(b"\x00\x00\x00")
    with pytest.raises(FrameSyntaxError, match="field table has length 9 but only 0 bytes follow"):
        decode_table(b"\x00\x00\x00\x09")
    with pytest.raises(FrameSyntaxError, match="field table: field 'k' has unknown type b'q'"):
        decode_table(table_bytes((b"k", b"q", b"")))


@pytest.mark.parametrize(
    ("field_value", "message"),
    [
        (integer(128, Kind.INT8), r"field 'n': 128 does not fit integer kind INT8"),
        (integer(-1, Kind.UINT8), "field 'n': -1 does not fit integer kind UINT8"),
        (integer(-32769, Kind.INT16), "does not fit integer kind INT16"),
        (integer(65536, Kind.UINT16), "does not fit integer kind UINT16"),
        (integer(2**31, Kind.INT32), "does not fit integer kind INT32"),
        (integer(-1, Kind.UINT32), "does not fit integer kind UINT32"),
        (integer(3, 99), "field 'n' has unknown integer kind 99"),
        (value(decimal_value={"scale": 256}), "field 'n': decimal scale 256"),
        (value(decimal_value={"value": 2**31}), "field 'n': decimal scale 0, value 2147483648 do not fit"),
        (
            value(array_value=messages_pb2.FieldArray(values=[value(), integer(300, Kind.UINT8)])),
            r"field 'n\[1\]': 300 does not fit integer kind UINT8",
        ),
    ],
)
def test_values_that_do_not_fit_raise_value_errors(field_value, message):
    with pytest.raises(ValueError, match=message):
        encode_table(table(n=field_value))


def test_properties_that_do_not_fit_raise_value_errors():
    with pytest.raises(ValueError, match="content header property priority is not an octet: 256"):
        encode_properties(messages_pb2.BasicProperties(priority=256))
    with pytest.raises(ValueError, match="content header property delivery_mode is not an octet: 300"):
        encode_properties(messages_pb2.BasicProperties(delivery_mode=300))
    with pytest.raises(ValueError, match="content header property app_id is longer than 255 bytes"):
        encode_properties(messages_pb2.BasicProperties(app_id="é" * 128))
    with pytest.raises(ValueError, match="field name 'kkk.*is longer than 255 bytes"):
        encode_table(dict_to_table({"k" * 256: 1}))


def test_a_value_with_nothing_set_is_written_as_void():
    assert encode_table(table(n=value())) == table_bytes((b"n", b"V", b""))
