"""The rules every publish and declare meets (brokerd.model.property_rules), the
AMQP decoder's depth limit, and field values that convert to Python without failing."""

import datetime
import decimal
import struct

import pytest

from brokerd.amqp.properties import decode_properties, decode_table
from brokerd.errors import PreconditionFailed
from brokerd.model.message import Message
from brokerd.model.property_rules import HEADER, check_arguments, check_properties, check_table
from brokerd.proto import messages_pb2
from brokerd.proto.tables import (
    FIRST_DATETIME_SECONDS,
    LAST_DATETIME_SECONDS,
    MAX_TABLE_DEPTH,
    TimestampSeconds,
    dict_to_table,
    freeze,
    table_to_dict,
    value_to_python,
)
from tests.support.broker import make_broker, open_channel

Kind = messages_pb2.IntegerKind


def nested(levels):
    """A dict nested C{levels} deep (itself counting 1), ending in a list: C{{"x-a": {"a": ... [1]}}}."""
    value = [1]
    for _ in range(levels - 2):
        value = {"a": value}
    return {"x-a": value}


def one_field(**value):
    """A FieldTable of one field "f" holding the raw FieldValue C{value}."""
    table = messages_pb2.FieldTable()
    field = table.fields.add()
    field.name = "f"
    for kind, content in value.items():
        if kind == "decimal_value":
            field.value.decimal_value.scale, field.value.decimal_value.value = content
        else:
            setattr(field.value, kind, content)
    return table


def refusal(check, *args):
    with pytest.raises(PreconditionFailed) as raised:
        check(*args)
    assert raised.value.reply_code == 406
    return raised.value.text


# -- properties


@pytest.mark.parametrize("name", ["priority", "delivery_mode"])
def test_octet_properties_must_fit_an_octet(name):
    check_properties(messages_pb2.BasicProperties(**{name: 255}))
    assert refusal(check_properties, messages_pb2.BasicProperties(**{name: 256})) == (
        f"invalid property {name}: 256 is outside 0..255"
    )


@pytest.mark.parametrize(
    "name", ["content_type", "content_encoding", "correlation_id", "reply_to", "expiration", "message_id", "type",
             "user_id", "app_id"]
)
def test_short_string_properties_hold_at_most_255_bytes_of_utf8(name):
    check_properties(messages_pb2.BasicProperties(**{name: "x" * 255}))
    check_properties(messages_pb2.BasicProperties(**{name: "\U0001F600" * 63}))  # 252 bytes
    text = refusal(check_properties, messages_pb2.BasicProperties(**{name: "é" * 128}))
    assert text == f"invalid property {name}: 256 bytes of UTF-8, longer than the limit of 255 bytes"


def test_header_names_hold_at_most_255_bytes():
    fine = messages_pb2.BasicProperties()
    dict_to_table({"n" * 255: 1}, fine.headers)
    check_properties(fine)
    long = messages_pb2.BasicProperties()
    dict_to_table({"n" * 256: 1}, long.headers)
    text = refusal(check_properties, long)
    assert text.startswith("invalid header name 'nnnn") and "256 bytes of UTF-8" in text


def test_a_long_name_inside_a_header_is_named_with_where_it_is():
    properties = messages_pb2.BasicProperties()
    dict_to_table({"outer": [0, {"k" * 300: 1}]}, properties.headers)
    assert refusal(check_properties, properties) == (
        "invalid header 'outer' (at outer[1].kkkkkkkkkkkkkkkkkkkk): field name of 300 bytes of UTF-8, longer than"
        " the limit of 255 bytes"
    )


# -- native field tables


def test_tables_may_nest_as_deep_as_the_limit_and_no_deeper():
    check_table(dict_to_table(nested(MAX_TABLE_DEPTH)), HEADER)
    assert refusal(check_table, dict_to_table(nested(MAX_TABLE_DEPTH + 1)), HEADER) == (
        f"invalid header 'x-a': field tables and arrays nest deeper than the limit of {MAX_TABLE_DEPTH} levels"
    )


@pytest.mark.parametrize("seconds", [FIRST_DATETIME_SECONDS, 0, LAST_DATETIME_SECONDS])
def test_native_timestamps_within_the_years_1_to_9999_are_accepted(seconds):
    check_table(one_field(timestamp_value=seconds), HEADER)


@pytest.mark.parametrize("seconds", [FIRST_DATETIME_SECONDS - 1, LAST_DATETIME_SECONDS + 1, 2**63 - 1, -(2**63)])
def test_native_timestamps_beyond_the_years_1_to_9999_are_refused(seconds):
    text = refusal(check_table, one_field(timestamp_value=seconds), HEADER)
    assert text.startswith(f"invalid header 'f': timestamp {seconds} is outside the years 1..9999")


@pytest.mark.parametrize(
    "scale, value, problem",
    [
        (256, 1, "decimal scale 256 is outside 0..255"),
        (2**32 - 1, 1, "decimal scale 4294967295 is outside 0..255"),
        (2, 2**31, "decimal value 2147483648 does not fit a signed 32-bit integer"),
        (2, -(2**31) - 1, "decimal value -2147483649 does not fit a signed 32-bit integer"),
    ],
)
def test_native_decimals_must_fit_amqp(scale, value, problem):
    assert refusal(check_table, one_field(decimal_value=(scale, value)), HEADER) == f"invalid header 'f': {problem}"


def test_native_decimals_at_amqps_bounds_are_accepted():
    check_table(one_field(decimal_value=(255, 2**31 - 1)), HEADER)
    check_table(one_field(decimal_value=(0, -(2**31))), HEADER)


@pytest.mark.parametrize(
    "kind, value", [(Kind.UINT8, 256), (Kind.INT8, -129), (Kind.UINT16, -1), (Kind.INT32, 2**31), (Kind.UINT32, 2**32)]
)
def test_native_integers_must_fit_their_kind(kind, value):
    text = refusal(check_table, one_field(integer_value=value, integer_kind=kind), HEADER)
    assert text.startswith(f"invalid header 'f': {value} does not fit integer kind {Kind.Name(kind)}")


def test_an_unknown_integer_kind_is_refused():
    assert refusal(check_table, one_field(integer_value=1, integer_kind=99), HEADER) == (
        "invalid header 'f': unknown integer kind 99"
    )


# -- declare arguments (Python values, from either protocol)


def test_arguments_may_nest_as_deep_as_the_limit_and_no_deeper():
    check_arguments(nested(MAX_TABLE_DEPTH))
    assert refusal(check_arguments, nested(MAX_TABLE_DEPTH + 1)) == (
        f"invalid arg 'x-a': field tables and arrays nest deeper than the limit of {MAX_TABLE_DEPTH} levels"
    )


def test_arguments_nested_far_too_deep_are_refused_without_walking_them_all():
    check = nested(5000)  # deeper than Python's recursion limit
    assert "deeper than the limit" in refusal(check_arguments, check)


@pytest.mark.parametrize(
    "value, problem",
    [
        (2**63, "integer 9223372036854775808 does not fit 64 bits"),
        (decimal.Decimal("1E+20"), "decimal value 1E+20 does not fit a signed 32-bit integer"),
        (decimal.Decimal("1E-300"), "decimal scale 300 is outside 0..255"),
        (decimal.Decimal("NaN"), "decimal NaN is not a finite number"),
        (object(), "a value of type object cannot be kept in a field table"),
    ],
)
def test_arguments_that_cannot_be_stored_are_refused(value, problem):
    assert refusal(check_arguments, {"x-v": value}) == f"invalid arg 'x-v': {problem}"


def test_arguments_of_every_storable_type_are_accepted():
    check_arguments({
        "none": None, "bool": True, "int": -(2**63), "float": 0.5, "str": "s", "bytes": b"b",
        "when": datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc), "far": TimestampSeconds(2**62),
        "decimal": decimal.Decimal("-21474836.48"), "zero": decimal.Decimal("0E+99999999"),
        "table": {"list": [1, (2, 3)]},
    })


# -- reading any field value back


@pytest.mark.parametrize("seconds", [2**63 - 1, -(2**63), LAST_DATETIME_SECONDS + 1, FIRST_DATETIME_SECONDS - 1])
def test_a_timestamp_beyond_datetime_reads_as_its_seconds_and_writes_back_unchanged(seconds):
    table = one_field(timestamp_value=seconds)
    values = table_to_dict(table)
    assert values == {"f": TimestampSeconds(seconds)}
    assert dict_to_table(values) == table


def test_timestamps_within_datetime_still_read_as_datetimes():
    assert table_to_dict(one_field(timestamp_value=LAST_DATETIME_SECONDS))["f"] == datetime.datetime(
        9999, 12, 31, 23, 59, 59, tzinfo=datetime.timezone.utc
    )


def test_any_decimal_reads_as_an_exact_decimal():
    value = messages_pb2.FieldValue()
    value.decimal_value.scale, value.decimal_value.value = 2**32 - 1, -(2**63)
    digits = tuple(map(int, str(2**63)))
    assert value_to_python(value).as_tuple() == decimal.DecimalTuple(1, digits, -(2**32 - 1))
    value.decimal_value.scale, value.decimal_value.value = 2, -1234
    assert value_to_python(value) == decimal.Decimal("-12.34")


def test_a_far_timestamp_equals_only_a_timestamp_of_the_same_seconds():
    assert freeze(TimestampSeconds(2**62)) == freeze(TimestampSeconds(2**62))
    assert freeze(TimestampSeconds(2**62)) != freeze(2**62)


# -- the AMQP decoder


def header_frame_properties(table):
    return struct.pack(">H", 0x2000) + table


def deep_amqp_table(levels):
    """AMQP bytes of a table C{levels} deep: each level one field "a" holding the next table."""
    table = struct.pack(">I", 0)
    for _ in range(levels - 1):
        field = b"\x01aF" + table
        table = struct.pack(">I", len(field)) + field
    return table


def test_amqp_headers_as_deep_as_the_limit_are_decoded():
    properties = decode_properties(header_frame_properties(deep_amqp_table(MAX_TABLE_DEPTH)))
    depth, table = 1, properties.headers
    while table.fields:
        table, depth = table.fields[0].value.table_value, depth + 1
    assert depth == MAX_TABLE_DEPTH


@pytest.mark.parametrize("levels", [MAX_TABLE_DEPTH + 1, 20_000])
def test_amqp_headers_nested_too_deep_are_a_406_naming_the_header(levels):
    text = refusal(decode_properties, header_frame_properties(deep_amqp_table(levels)))
    assert text == f"invalid header 'a': field tables and arrays nest deeper than the limit of {MAX_TABLE_DEPTH} levels"


def test_amqp_tables_nested_too_deep_are_a_406_naming_the_argument():
    text = refusal(decode_table, deep_amqp_table(MAX_TABLE_DEPTH + 1))
    assert text.startswith("invalid arg 'a': field tables and arrays nest deeper")


# -- the channel: checked before anything is kept


def test_a_refused_publish_keeps_nothing_not_even_in_a_transaction():
    broker, _clock = make_broker()
    channel, _peer = open_channel(broker)
    channel.queue_declare("q")
    channel.tx_select()
    with pytest.raises(PreconditionFailed):
        channel.basic_publish("", "q", messages_pb2.BasicProperties(priority=300), b"poison")
    channel.tx_commit()
    assert broker.vhost("/").queues["q"].message_count == 0


def test_properties_decoded_from_amqp_bytes_are_not_checked_again():
    broker, _clock = make_broker()
    channel, _peer = open_channel(broker)
    channel.queue_declare("q")
    encoded = b"\x08\x00\x05"  # priority 5
    channel.publish(Message("", "q", decode_properties(encoded), b"body", encoded))
    assert broker.vhost("/").queues["q"].message_count == 1


def test_declares_binds_and_consumes_check_their_arguments():
    broker, _clock = make_broker()
    channel, _peer = open_channel(broker)
    too_deep = nested(MAX_TABLE_DEPTH + 1)
    for call in (
        lambda: channel.queue_declare("deep", durable=True, arguments=too_deep),
        lambda: channel.exchange_declare("deep", "headers", arguments=too_deep),
    ):
        with pytest.raises(PreconditionFailed):
            call()
    assert "deep" not in broker.vhost("/").queues and "deep" not in broker.vhost("/").exchanges
    channel.queue_declare("q")
    for call in (
        lambda: channel.queue_bind("q", "amq.headers", "", too_deep),
        lambda: channel.queue_unbind("q", "amq.headers", "", too_deep),
        lambda: channel.basic_consume("q", arguments=too_deep),
    ):
        with pytest.raises(PreconditionFailed):
            call()
    assert not broker.vhost("/").exchanges["amq.headers"].bindings and not channel.consumers


def test_a_headers_exchange_matches_a_far_timestamp_only_to_the_same_timestamp():
    broker, _clock = make_broker()
    channel, _peer = open_channel(broker)
    for queue, value in (("same", TimestampSeconds(2**62)), ("integer", 2**62), ("other", TimestampSeconds(1))):
        channel.queue_declare(queue)
        channel.queue_bind(queue, "amq.headers", "", {"stamp": value})
    encoded = header_frame_properties(struct.pack(">I", 15) + b"\x05stampT" + struct.pack(">q", 2**62))
    channel.publish(Message("amq.headers", "", decode_properties(encoded), b"body", encoded))
    counts = {name: queue.message_count for name, queue in broker.vhost("/").queues.items()}
    assert counts == {"same": 1, "integer": 0, "other": 0}
