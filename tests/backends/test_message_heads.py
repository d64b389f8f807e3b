"""The encoded head of a stored message: what protobuf gives for the StoredMessage without its
body, encoded once for a run of messages published alike, and again for any that differs."""

import pytest

from backends.common.message_heads import MessageHeads, encode_head
from brokerd.interfaces import SerializedPropertiesMessage
from brokerd.model.message import Message
from brokerd.proto import messages_pb2


def stored(message, valid):
    record = messages_pb2.StoredMessage(exchange=message.exchange, routing_key=message.routing_key,
                                        properties=message.properties)
    if valid:
        record.valid = True
    if message.published_at is not None:
        record.published_at = message.published_at
    return record


@pytest.mark.parametrize("valid", [False, True])
def test_a_head_parses_back_to_the_message_without_its_body(valid):
    properties = messages_pb2.BasicProperties(delivery_mode=2, content_type="text/plain")
    message = Message("amq.topic", "a.b", properties, b"body")
    message.published_at = 1_700_000_000_000
    head = encode_head(message, valid)
    assert head == stored(message, valid).SerializeToString()
    parsed = messages_pb2.StoredMessage.FromString(head)
    assert (parsed.exchange, parsed.routing_key, parsed.properties, parsed.published_at, parsed.body) == (
        "amq.topic", "a.b", properties, 1_700_000_000_000, b"")
    assert parsed.HasField("valid") is valid


def test_messages_published_alike_share_one_head_and_any_difference_gets_its_own():
    heads = MessageHeads(valid=True)
    properties = messages_pb2.BasicProperties(delivery_mode=2)
    first = heads.encode(Message("", "q", properties, b"1"))
    assert heads.encode(Message("", "q", properties, b"2")) is first
    equal_but_other = messages_pb2.BasicProperties(delivery_mode=2, priority=3)
    timed = Message("", "q", properties, b"5")
    timed.published_at = 42
    for message in (Message("x", "q", properties, b"3"), Message("", "r", properties, b"4"), timed,
                    Message("", "q", equal_but_other, b"6"), Message("", "q", properties, b"7")):
        head = heads.encode(message)
        assert head == stored(message, True).SerializeToString()
    assert heads.encode(Message("", "q", properties, b"8")) == first


def parsed(head):
    return messages_pb2.StoredMessage.FromString(head)


@pytest.mark.parametrize("valid", [False, True])
@pytest.mark.parametrize("published_at", [None, 1_760_000_000_123])
def test_serialized_properties_give_the_head_of_the_same_message_with_a_properties_object(
        valid, published_at):
    properties = messages_pb2.BasicProperties(delivery_mode=2, message_id="m1")
    as_object = Message("amq.topic", "a.b", properties, b"")
    as_object.published_at = published_at
    serialized = SerializedPropertiesMessage("amq.topic", "a.b", properties.SerializeToString(), b"",
                                             published_at)
    head = MessageHeads(valid=valid).encode(serialized)
    assert parsed(head) == stored(as_object, valid)
    if valid:  # the filelog flips its valid flag at byte 1 of each record
        assert head[:2] == b"\x08\x01"


def test_each_serialized_message_keeps_its_own_properties_and_fields_around_them():
    heads = MessageHeads(valid=True)
    base = messages_pb2.BasicProperties(message_id="m1").SerializeToString()
    later = messages_pb2.BasicProperties(priority=5).SerializeToString()
    found = [parsed(heads.encode(SerializedPropertiesMessage(exchange, key, base + extra, b"")))
             for exchange, key, extra in (("x", "a", b""), ("x", "a", later), ("x", "b", b""),
                                          ("y", "b", b""))]
    assert [(one.exchange, one.routing_key, one.properties.priority) for one in found] == [
        ("x", "a", 0), ("x", "a", 5), ("x", "b", 0), ("y", "b", 0)]
    assert {one.properties.message_id for one in found} == {"m1"}


def test_serialized_properties_are_parsed_only_when_asked_for():
    message = SerializedPropertiesMessage("", "q", b"\xff\xff", b"")  # not a valid encoding
    MessageHeads().encode(message)
    with pytest.raises(Exception):
        message.properties
