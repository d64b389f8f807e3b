"""brokerd.amqp.table_arguments: the linear decoder of methods that carry field tables,
value for value and type for type against pamqp's own decoding of the same bytes.

pamqp is the reference for what decoding yields; the decoder must also refuse,
with a broker error naming the argument, every truncated or malformed input,
and nesting deeper than the limit without ever recursing without bound.
"""

import datetime
import decimal
import itertools
import struct

import pytest
from pamqp import commands
from pamqp import decode as pamqp_decode
from pamqp import frame as pamqp_frame

from brokerd.amqp.table_arguments import TABLE_METHODS, decode_method, decode_table_fields
from brokerd.errors import FrameSyntaxError, PreconditionFailed
from brokerd.proto.tables import MAX_TABLE_DEPTH

ARGUMENT_TABLES = {
    "empty": {},
    "rabbitmq": {"x-message-ttl": 60000, "x-dead-letter-exchange": "dlx", "x-max-priority": 10,
                 "x-queue-type": "classic"},
    "every encodable type": {
        "bool": True,
        "false": False,
        "small": -5,
        "int32": -(2**31),
        "int64": 2**40,
        "text": "héllo ☃",
        "empty": "",
        "bytes": bytearray(b"\xff\x00\xfe"),
        "double": 2.5,
        "decimal": decimal.Decimal("-1.23"),
        "whole decimal": decimal.Decimal("17"),
        "when": datetime.datetime(2020, 2, 29, 12, 30, tzinfo=datetime.timezone.utc),
        "nothing": None,
        "array": [1, "two", None, [3.5, {"k": "v"}], {}],
        "table": {"inner": {"deeper": [True, b"x".decode()]}},
    },
    "duplicate-looking names": {"a": 1, "A": 2, "é": 3, "": 4},
}


def same(expected, decoded, where="value"):
    """Asserts C{decoded} equals C{expected} in value and in type, all the way down."""
    assert type(decoded) is type(expected), f"{where}: {type(decoded).__name__}, pamqp gives {type(expected).__name__}"
    if isinstance(expected, dict):
        assert list(decoded) == list(expected), f"{where}: keys {list(decoded)}, pamqp gives {list(expected)}"
        for key in expected:
            same(expected[key], decoded[key], f"{where}[{key!r}]")
    elif isinstance(expected, list):
        assert len(decoded) == len(expected), where
        for index, (left, right) in enumerate(zip(expected, decoded)):
            same(left, right, f"{where}[{index}]")
    elif isinstance(expected, decimal.Decimal):
        assert decoded.as_tuple() == expected.as_tuple(), f"{where}: {decoded!r}, pamqp gives {expected!r}"
    else:
        assert decoded == expected, f"{where}: {decoded!r}, pamqp gives {expected!r}"


def pamqp_unmarshal(frame_bytes):
    """pamqp's method for a whole method frame (its index read from the frame)."""
    index = struct.unpack_from(">I", frame_bytes, 7)[0]
    method = commands.INDEX_MAPPING[index]()
    method.unmarshal(frame_bytes[11:-1])
    return index, method


def decoded_by_both(method, refusal=PreconditionFailed):
    frame_bytes = pamqp_frame.marshal(method, 1)
    index, expected = pamqp_unmarshal(frame_bytes)
    decoded = decode_method(index, frame_bytes, 11, len(frame_bytes) - 1, refusal)
    assert type(decoded) is type(expected)
    for name in expected.__slots__:
        same(getattr(expected, name), getattr(decoded, name), name)
    return decoded


def table_methods(table):
    """One of each method that carries a table, the table in its table argument."""
    return [
        commands.Connection.StartOk(client_properties=table, mechanism="AMQPLAIN", response="\0a\0p€",
                                    locale="de_DE"),
        commands.Exchange.Declare(exchange="ex", exchange_type="headers", durable=True, internal=True, arguments=table),
        commands.Exchange.Bind(destination="d", source="s", routing_key="r.#", nowait=True, arguments=table),
        commands.Exchange.Unbind(destination="d", source="s", routing_key="", arguments=table),
        commands.Queue.Declare(queue="q", exclusive=True, auto_delete=True, arguments=table),
        commands.Queue.Bind(queue="q", exchange="amq.headers", routing_key="k", arguments=table),
        commands.Queue.Unbind(queue="q", exchange="amq.direct", routing_key="k", arguments=table),
        commands.Basic.Consume(queue="q", consumer_tag="ctag", no_ack=True, exclusive=True, arguments=table),
    ]


def test_every_method_that_carries_a_table_is_decoded_here():
    expected = {method.index for method in table_methods({})} | {commands.Connection.Start.index}
    assert set(TABLE_METHODS) == expected


@pytest.mark.parametrize("table_name", ARGUMENT_TABLES)
@pytest.mark.parametrize("method_index", range(8))
def test_methods_with_tables_decode_to_pamqps_values(table_name, method_index):
    decoded_by_both(table_methods(ARGUMENT_TABLES[table_name])[method_index])


@pytest.mark.parametrize("bits", list(itertools.product([False, True], repeat=5)))
def test_bit_arguments_decode_as_pamqp_decodes_them(bits):
    passive, durable, exclusive, auto_delete, nowait = bits
    decoded_by_both(
        commands.Queue.Declare(
            queue="q", passive=passive, durable=durable, exclusive=exclusive, auto_delete=auto_delete, nowait=nowait
        )
    )
    decoded_by_both(
        commands.Exchange.Declare(
            exchange="x", passive=passive, durable=durable, auto_delete=auto_delete, internal=exclusive, nowait=nowait
        )
    )
    decoded_by_both(commands.Basic.Consume(queue="q", no_local=passive, no_ack=durable, exclusive=exclusive,
                                           nowait=nowait))


def test_a_response_that_is_not_utf8_stays_bytes_as_in_pamqp():
    payload = (struct.pack(">HH", 10, 11) + b"\0\0\0\0" + b"\x05PLAIN" + struct.pack(">I", 3) + b"\0\xe4\0"
               + b"\x05en_US")
    frame_bytes = struct.pack(">BHI", 1, 0, len(payload)) + payload + b"\xce"
    _, expected = pamqp_unmarshal(frame_bytes)
    decoded = decode_method(expected.index, frame_bytes, 11, len(frame_bytes) - 1, FrameSyntaxError)
    same(expected.response, decoded.response)
    assert decoded.response == b"\0\xe4\0"


def entry(name, tag, value=b""):
    return bytes((len(name),)) + name.encode() + tag + value


HAND_BUILT_ENTRIES = [
    entry("b", b"b", struct.pack(">b", -128)),
    entry("B", b"B", b"\xff"),
    entry("s", b"s", struct.pack(">h", -300)),
    entry("u", b"u", struct.pack(">H", 65535)),
    entry("I", b"I", struct.pack(">i", -7)),
    entry("i", b"i", struct.pack(">I", 2**32 - 1)),
    entry("l", b"l", struct.pack(">q", -(2**63))),
    entry("L", b"L", struct.pack(">Q", 2**64 - 1)),
    entry("f", b"f", struct.pack(">f", 0.25)),
    entry("d", b"d", struct.pack(">d", -1e300)),
    entry("D", b"D", struct.pack(">Bi", 255, -(2**31))),
    entry("D0", b"D", struct.pack(">Bi", 0, 42)),
    entry("S", b"S", struct.pack(">I", 2) + b"\xc3\xa9"),
    entry("S-not-utf8", b"S", struct.pack(">I", 2) + b"\xff\xfe"),
    entry("x", b"x", struct.pack(">I", 3) + b"abc"),
    entry("V", b"V"),
    entry("zero", b"\x00"),
    entry("t", b"t", b"\x02"),
    entry("T", b"T", struct.pack(">Q", 1700000000)),
    entry("T-ms", b"T", struct.pack(">Q", 1700000000123)),
    entry("A", b"A", struct.pack(">I", 6) + b"V\x00t\x01B\x09"),
    entry("F", b"F", struct.pack(">I", 3) + entry("k", b"V")),
    entry("b", b"B", b"\x01"),  # the same name again: the later value wins, the first place stays
]


@pytest.mark.parametrize("count", [1, len(HAND_BUILT_ENTRIES)])
def test_hand_built_tables_with_every_type_tag_decode_to_pamqps_values(count):
    fields = b"".join(HAND_BUILT_ENTRIES[:count])
    _, expected = pamqp_decode.field_table(struct.pack(">I", len(fields)) + fields)

    same(expected, decode_table_fields(fields, 0, len(fields)))


def test_decoding_reads_only_between_start_and_end_of_a_larger_buffer():
    fields = b"".join(HAND_BUILT_ENTRIES)
    _, expected = pamqp_decode.field_table(struct.pack(">I", len(fields)) + fields)
    buffer = b"\xffjunk" + fields + b"\x05trailing"

    same(expected, decode_table_fields(buffer, 5, 5 + len(fields)))


# -- refusals


def declare_frame(arguments_bytes):
    payload = struct.pack(">HHH", 50, 10, 0) + b"\x01q" + b"\x00" + arguments_bytes
    return struct.pack(">BHI", 1, 1, len(payload)) + payload + b"\xce"


def decode_declare(frame_bytes, refusal=PreconditionFailed):
    return decode_method(commands.Queue.Declare.index, frame_bytes, 11, len(frame_bytes) - 1, refusal)


def test_every_truncation_of_a_method_is_a_syntax_error_not_a_crash():
    declare = commands.Queue.Declare(queue="q", arguments=ARGUMENT_TABLES["every encodable type"])
    frame_bytes = pamqp_frame.marshal(declare, 1)
    for end in range(11, len(frame_bytes) - 1):
        with pytest.raises(FrameSyntaxError) as raised:
            decode_method(commands.Queue.Declare.index, frame_bytes, 11, end, PreconditionFailed)
        assert "queue.declare" in str(raised.value)


@pytest.mark.parametrize(
    "arguments_bytes, complaint",
    [
        (struct.pack(">I", 2**31) + b"\x01a", "arguments has a table of 2147483648 bytes but only 2 bytes follow"),
        (struct.pack(">I", 7) + entry("a", b"S", struct.pack(">I", 2**28)), "field 'a' has a long string of 268435456"),
        (struct.pack(">I", 3) + entry("a", b"Z"), "field 'a' has a value of unknown type b'Z'"),
        (struct.pack(">I", 3) + b"\x02\xff\xfe", "field name that is not valid UTF-8"),
        (struct.pack(">I", 2) + b"\x01a", "field 'a' has no value"),
        (struct.pack(">I", 4) + entry("a", b"I", b"\0"), "field 'a' has a 'I' value cut off"),
        (struct.pack(">I", 7) + entry("a", b"A", struct.pack(">I", 9)), "field 'a' has an array of 9 bytes"),
    ],
    ids=["table-length", "string-length", "unknown-type", "name-utf8", "no-value", "number-cut", "array-length"],
)
def test_malformed_arguments_are_syntax_errors_naming_the_argument(arguments_bytes, complaint):
    with pytest.raises(FrameSyntaxError) as raised:
        decode_declare(declare_frame(arguments_bytes))

    assert raised.value.reply_code == 502
    assert "queue.declare arguments" in raised.value.text and complaint in raised.value.text, raised.value.text


def nested(depth):
    """An encoded arguments table {"x-deep": {"a": {...}}} nested C{depth} levels, itself included."""
    inner = b""
    for _ in range(depth - 1):
        inner = struct.pack(">I", len(inner) + 3) + entry("a", b"F", inner) if inner else struct.pack(">I", 0)
    table = entry("x-deep", b"F", inner) if depth > 1 else b""
    return struct.pack(">I", len(table)) + table


def arrays(depth):
    """An encoded arguments table {"x-deep": [[[...]]]}: C{depth} levels of arrays in the table."""
    inner = b""
    for _ in range(depth):
        inner = b"A" + struct.pack(">I", len(inner)) + inner
    table = entry("x-deep", b"", inner)
    return struct.pack(">I", len(table)) + table


def test_nesting_up_to_the_limit_is_decoded():
    method = decode_declare(declare_frame(nested(MAX_TABLE_DEPTH)))
    depth, value = 1, method.arguments
    while value:
        depth, value = depth + 1, value.get("x-deep", value.get("a"))
    assert depth == MAX_TABLE_DEPTH
    assert decode_declare(declare_frame(arrays(MAX_TABLE_DEPTH - 1))).arguments["x-deep"] is not None


@pytest.mark.parametrize("encoded", [nested(MAX_TABLE_DEPTH + 1), arrays(MAX_TABLE_DEPTH), arrays(100_000)],
                         ids=["tables", "arrays", "100000-arrays"])
def test_nesting_past_the_limit_is_refused_naming_the_argument(encoded):
    with pytest.raises(PreconditionFailed) as raised:
        decode_declare(declare_frame(encoded))

    text = raised.value.text
    assert "queue.declare arguments field 'x-deep'" in text and f"deeper than {MAX_TABLE_DEPTH} levels" in text


def test_on_channel_zero_a_refusal_is_the_callers_connection_error():
    table = nested(MAX_TABLE_DEPTH + 1)
    payload = struct.pack(">HH", 10, 11) + table + b"\x05PLAIN" + struct.pack(">I", 0) + b"\x05en_US"
    frame_bytes = struct.pack(">BHI", 1, 0, len(payload)) + payload + b"\xce"

    with pytest.raises(FrameSyntaxError) as raised:
        decode_method(commands.Connection.StartOk.index, frame_bytes, 11, len(frame_bytes) - 1, FrameSyntaxError)

    assert "connection.startok client_properties field 'x-deep'" in raised.value.text


def test_a_timestamp_beyond_what_python_holds_is_refused_not_a_crash():
    encoded = entry("x-when", b"T", struct.pack(">Q", 2**64 - 1))
    with pytest.raises(PreconditionFailed) as raised:
        decode_declare(declare_frame(struct.pack(">I", len(encoded)) + encoded))

    assert "field 'x-when' has a timestamp" in raised.value.text
