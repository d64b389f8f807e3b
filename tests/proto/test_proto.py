"""The protobuf schema: generated modules are current, tables convert both ways."""

import datetime
import decimal
import importlib.util
import pathlib
import re

import pytest

from brokerd.proto import compile as proto_compile
from brokerd.proto import messages_pb2
from brokerd.proto.tables import dict_to_table, freeze, table_to_dict

PROTO_DIR = pathlib.Path(proto_compile.__file__).parent


def test_generated_modules_match_the_proto_sources(tmp_path):
    if importlib.util.find_spec("grpc_tools") is None:
        pytest.fail("grpcio-tools is missing: install the test extra (pip install -e '.[test]')")
    generated = proto_compile.compile_protos(tmp_path)
    assert [path.name for path in generated] == ["messages_pb2.py", "native_pb2.py", "replication_pb2.py"]
    for fresh in generated:
        committed = PROTO_DIR / fresh.name
        assert committed.read_text() == fresh.read_text(), (
            f"{committed} is stale: run `python -m brokerd.proto.compile` and commit the result"
        )


def test_every_amqp_basic_property_is_in_the_schema():
    fields = set(messages_pb2.BasicProperties.DESCRIPTOR.fields_by_name)
    amqp = {
        "content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id",
        "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id",
    }
    assert amqp | {"id", "routing_key"} <= fields


def test_stored_message_valid_flag_sits_at_byte_one():
    record = messages_pb2.StoredMessage(valid=True, exchange="x", body=b"body")
    encoded = bytearray(record.SerializeToString())
    assert encoded[:2] == b"\x08\x01"
    encoded[1] = 0
    flipped = messages_pb2.StoredMessage.FromString(bytes(encoded))
    assert flipped.HasField("valid") and flipped.valid is False
    assert flipped.body == b"body"


def test_tables_round_trip_every_value_type():
    values = {
        "text": "héllo",
        "raw": b"\x00\xff",
        "int": -(2**63),
        "big": 2**63 - 1,
        "float": 2.5,
        "yes": True,
        "no": False,
        "when": datetime.datetime(2026, 11, 22, 3, 0, tzinfo=datetime.timezone.utc),
        "nested": {"inner": {"deep": [1, "two", None]}},
        "list": [1, 2.0, "three", b"four", [5], {"six": 6}],
        "nothing": None,
        "money": decimal.Decimal("12.34"),
    }
    table = messages_pb2.FieldTable.FromString(dict_to_table(values).SerializeToString())
    assert table_to_dict(table) == values
    assert list(table_to_dict(table)) == list(values)  # order kept


def test_tables_refuse_what_they_cannot_carry():
    with pytest.raises(ValueError, match="'huge'"):
        dict_to_table({"huge": 2**64})
    with pytest.raises(TypeError, match="'thing'"):
        dict_to_table({"thing": object()})
    with pytest.raises(TypeError, match="keys must be str"):
        dict_to_table({1: "x"})


def test_freeze_tells_booleans_from_integers_and_ignores_dict_order():
    assert freeze({"a": 1, "b": [1, 2]}) == freeze({"b": [1, 2], "a": 1})
    assert freeze(True) != freeze(1)
    assert hash(freeze({"a": {"b": [b"x"]}}))


def test_generated_code_is_not_newer_than_the_oldest_protobuf_runtime_allowed():
    setup_py = (PROTO_DIR.parent.parent / "setup.py").read_text()
    allowed = re.search(r'"protobuf>=([\d.]+)', setup_py).group(1)
    for module in ("messages_pb2.py", "native_pb2.py"):
        generated = re.search(r"# Protobuf Python Version: ([\d.]+)", (PROTO_DIR / module).read_text()).group(1)
        assert _version(generated) <= _version(allowed), (
            f"{module} needs protobuf {generated}, setup.py allows {allowed}")


def _version(text):
    return tuple(int(part) for part in text.split("."))
