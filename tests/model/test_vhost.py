"""VirtualHost topology rules: declares, deletes, names, exclusivity, auto-delete and the store."""

import pytest

from brokerd.errors import AccessRefused, CommandInvalid, NotFound, PreconditionFailed, ResourceLocked
from brokerd.model.message import Message
from brokerd.model.vhost import DEFAULT_EXCHANGE_REFUSAL
from brokerd.proto import messages_pb2
from tests.support.broker import make_broker, open_channel, properties


@pytest.fixture
def broker():
    return make_broker()[0]


@pytest.fixture
def vhost(broker):
    return broker.vhost("/")


def stored_topology(store):
    """What the store holds, as readable tuples."""
    found = set()
    for record in store.topology():
        if isinstance(record, messages_pb2.ExchangeRecord):
            found.add(("exchange", record.name))
        elif isinstance(record, messages_pb2.QueueRecord):
            found.add(("queue", record.name))
        else:
            found.add(("binding", record.exchange, record.queue, record.routing_key))
    return found


def publish(vhost, exchange, routing_key, persistent=False):
    """Publishes through the vhost; returns how many queues took the message."""
    routed, _stored, _refused = vhost.publish(exchange, Message(exchange, routing_key, properties(persistent), b"m"))
    return routed


# -- declare and redeclare


def test_exchange_declare_is_idempotent(vhost):
    first = vhost.declare_exchange("ex", "topic", durable=True, arguments={"alternate-exchange": "ae"})
    again = vhost.declare_exchange("ex", "topic", durable=True, arguments={"alternate-exchange": "ae"})
    assert again is first


def test_queue_declare_is_idempotent_and_keeps_messages(vhost):
    first = vhost.declare_queue("q", durable=True, arguments={"x-max-length": 10})
    publish(vhost, "", "q")
    again = vhost.declare_queue("q", durable=True, arguments={"x-max-length": 10})
    assert again is first
    assert again.message_count == 1


@pytest.mark.parametrize(
    "changed, attribute",
    [
        ({"type_name": "fanout"}, "type"),
        ({"durable": False}, "durable"),
        ({"auto_delete": True}, "auto_delete"),
        ({"internal": True}, "internal"),
        ({"arguments": {"alternate-exchange": "other"}}, "alternate-exchange"),
        ({"arguments": {}}, "alternate-exchange"),
    ],
)
def test_exchange_redeclare_with_other_attributes_is_refused(vhost, changed, attribute):
    original = {"type_name": "direct", "durable": True, "arguments": {"alternate-exchange": "ae"}}
    vhost.declare_exchange("ex", **original)
    with pytest.raises(PreconditionFailed) as caught:
        vhost.declare_exchange("ex", **(original | changed))
    assert caught.value.reply_code == 406
    assert repr(attribute) in caught.value.text and "'ex'" in caught.value.text
    assert vhost.exchanges["ex"].type_name == "direct"


def test_exchange_redeclare_with_other_unknown_arguments_keeps_the_first(vhost):
    first = vhost.declare_exchange("ex", "direct", arguments={"alternate-exchange": "ae", "x-extra": 1})
    assert vhost.declare_exchange("ex", "direct", arguments={"alternate-exchange": "ae", "x-extra": 2}) is first
    assert vhost.declare_exchange("ex", "direct", arguments={"alternate-exchange": "ae"}) is first
    assert first.arguments == {"alternate-exchange": "ae", "x-extra": 1}


@pytest.mark.parametrize(
    "changed, attribute",
    [
        ({"durable": False}, "durable"),
        ({"auto_delete": True}, "auto_delete"),
        ({"arguments": {"x-max-length": 11}}, "x-max-length"),
        ({"arguments": {}}, "x-max-length"),
        ({"arguments": {"x-max-length": True}}, "x-max-length"),
    ],
)
def test_queue_redeclare_with_other_attributes_is_refused(vhost, changed, attribute):
    original = {"durable": True, "arguments": {"x-max-length": 10}}
    vhost.declare_queue("q", **original)
    with pytest.raises(PreconditionFailed) as caught:
        vhost.declare_queue("q", **(original | changed))
    assert caught.value.reply_code == 406
    assert repr(attribute) in caught.value.text and "'q'" in caught.value.text


def test_passive_declares_find_existing_things_whatever_the_attributes(vhost):
    exchange = vhost.declare_exchange("ex", "topic", durable=True)
    queue = vhost.declare_queue("q", durable=True)
    assert vhost.declare_exchange("ex", "direct", passive=True) is exchange
    assert vhost.declare_queue("q", passive=True) is queue


@pytest.mark.parametrize("kind", ["exchange", "queue"])
def test_passive_declare_of_a_missing_thing_is_not_found(vhost, kind):
    with pytest.raises(NotFound) as caught:
        if kind == "exchange":
            vhost.declare_exchange("nowhere", "direct", passive=True)
        else:
            vhost.declare_queue("nowhere", passive=True)
    assert caught.value.reply_code == 404
    assert "'nowhere'" in caught.value.text
    assert "nowhere" not in vhost.exchanges and "nowhere" not in vhost.queues


@pytest.mark.parametrize("kind", ["exchange", "queue"])
def test_names_in_the_amq_namespace_are_reserved(vhost, kind):
    with pytest.raises(AccessRefused) as caught:
        if kind == "exchange":
            vhost.declare_exchange("amq.mine", "direct")
        else:
            vhost.declare_queue("amq.mine")
    assert caught.value.reply_code == 403
    assert "'amq.mine'" in caught.value.text
    assert "amq.mine" not in vhost.exchanges and "amq.mine" not in vhost.queues


@pytest.mark.parametrize("name", ["", "amq.direct", "amq.topic", "amq.headers", "amq.not-there"])
def test_broker_exchanges_cannot_be_deleted(vhost, name):
    with pytest.raises(AccessRefused) as caught:
        vhost.delete_exchange(name)
    assert caught.value.reply_code == 403
    assert repr(name) in caught.value.text if name else caught.value.text == DEFAULT_EXCHANGE_REFUSAL


def test_default_exchange_cannot_be_declared(vhost):
    with pytest.raises(AccessRefused) as caught:
        vhost.declare_exchange("", "direct")
    assert caught.value.reply_code == 403


def test_unknown_exchange_type_is_command_invalid(vhost):
    with pytest.raises(CommandInvalid) as caught:
        vhost.declare_exchange("ex", "x-consistent-hash")
    assert caught.value.reply_code == 503
    assert caught.value.closes_connection
    assert "'x-consistent-hash'" in caught.value.text
    assert "ex" not in vhost.exchanges


# -- delete


def test_exchange_delete_if_unused(vhost):
    vhost.declare_exchange("ex", "direct")
    vhost.declare_queue("q")
    vhost.bind("q", "ex", "k")
    with pytest.raises(PreconditionFailed) as caught:
        vhost.delete_exchange("ex", if_unused=True)
    assert caught.value.reply_code == 406 and "'ex'" in caught.value.text and "in use" in caught.value.text
    assert publish(vhost, "ex", "k") == 1
    vhost.unbind("q", "ex", "k")
    vhost.delete_exchange("ex", if_unused=True)
    assert "ex" not in vhost.exchanges


def test_queue_delete_if_unused(broker, vhost):
    channel, _peer = open_channel(broker)
    channel.queue_declare("q")
    tag = channel.basic_consume("q")
    with pytest.raises(PreconditionFailed) as caught:
        vhost.delete_queue("q", if_unused=True)
    assert caught.value.reply_code == 406 and "'q'" in caught.value.text and "in use" in caught.value.text
    channel.basic_cancel(tag)
    vhost.delete_queue("q", if_unused=True)
    assert "q" not in vhost.queues


def test_queue_delete_if_empty(vhost):
    vhost.declare_queue("q")
    publish(vhost, "", "q")
    with pytest.raises(PreconditionFailed) as caught:
        vhost.delete_queue("q", if_empty=True)
    assert caught.value.reply_code == 406 and "'q'" in caught.value.text and "not empty" in caught.value.text
    vhost.purge_queue("q")
    assert vhost.delete_queue("q", if_empty=True) == 0
    assert "q" not in vhost.queues


def test_queue_delete_returns_the_ready_messages_it_dropped(vhost):
    vhost.declare_queue("q")
    for _ in range(3):
        publish(vhost, "", "q")
    assert vhost.delete_queue("q") == 3


def test_deleting_missing_things_is_fine(vhost):
    assert vhost.delete_queue("nowhere") == 0
    vhost.delete_exchange("nowhere")
    vhost.declare_queue("q")
    vhost.declare_exchange("ex", "direct")
    vhost.unbind("q", "ex", "never-bound")


def test_queue_delete_removes_its_bindings(vhost):
    vhost.declare_exchange("ex", "fanout", durable=True)
    vhost.declare_queue("q", durable=True)
    vhost.bind("q", "ex", "")
    vhost.delete_queue("q")
    vhost.declare_queue("q", durable=True)
    assert publish(vhost, "ex", "") == 0
    assert ("binding", "ex", "q", "") not in stored_topology(vhost.store)


def test_exchange_delete_removes_its_bindings(vhost):
    vhost.declare_exchange("ex", "direct", durable=True)
    vhost.declare_queue("q", durable=True)
    vhost.bind("q", "ex", "k")
    vhost.delete_exchange("ex")
    vhost.declare_exchange("ex", "direct", durable=True)
    assert publish(vhost, "ex", "k") == 0
    assert stored_topology(vhost.store) == {("exchange", "ex"), ("queue", "q")}
    vhost.delete_queue("q")  # the queue's gone binding is no obstacle to deleting it
    assert stored_topology(vhost.store) == {("exchange", "ex")}


# -- names


LONGEST = "n" * 255
TOO_LONG = "n" * 256
LONGEST_MULTIBYTE = "é" * 127 + "a"  # 255 bytes of UTF-8
TOO_LONG_MULTIBYTE = "é" * 128  # 128 characters, 256 bytes


def _declare_exchange(broker, name):
    broker.vhost("/").declare_exchange(name, "direct")


def _declare_queue(broker, name):
    broker.vhost("/").declare_queue(name)


def _bind_with_key(broker, key):
    vhost = broker.vhost("/")
    vhost.declare_queue("q")
    vhost.bind("q", "amq.direct", key)


def _publish_with_key(broker, key):
    channel, _peer = open_channel(broker)
    channel.basic_publish("amq.direct", key, properties(), b"m")


def _consume_with_tag(broker, tag):
    channel, _peer = open_channel(broker)
    channel.queue_declare("q")
    channel.basic_consume("q", consumer_tag=tag)


SHORT_STRING_USES = [
    pytest.param(_declare_exchange, "exchange name", id="exchange-name"),
    pytest.param(_declare_queue, "queue name", id="queue-name"),
    pytest.param(_bind_with_key, "routing key", id="binding-key"),
    pytest.param(_publish_with_key, "routing key", id="publish-key"),
    pytest.param(_consume_with_tag, "consumer tag", id="consumer-tag"),
]


@pytest.mark.parametrize("use, kind", SHORT_STRING_USES)
@pytest.mark.parametrize("value", [LONGEST, LONGEST_MULTIBYTE], ids=["255-ascii", "255-multibyte"])
def test_short_strings_of_255_bytes_are_accepted(broker, use, kind, value):
    use(broker, value)


@pytest.mark.parametrize("use, kind", SHORT_STRING_USES)
@pytest.mark.parametrize("value", [TOO_LONG, TOO_LONG_MULTIBYTE], ids=["256-ascii", "256-multibyte"])
def test_short_strings_of_256_bytes_are_refused(broker, use, kind, value):
    with pytest.raises(PreconditionFailed) as caught:
        use(broker, value)
    assert caught.value.reply_code == 406
    assert kind in caught.value.text and "256 bytes" in caught.value.text


def test_server_named_queues_are_unique_amq_gen_names(vhost):
    names = {vhost.declare_queue("").name for _ in range(200)}
    assert len(names) == 200
    assert all(name.startswith("amq.gen-") for name in names)
    assert names <= set(vhost.queues)


# -- exclusive queues


EXCLUSIVE_QUEUE_USES = {
    "declare": lambda channel: channel.queue_declare("mine", exclusive=True),
    "passive-declare": lambda channel: channel.queue_declare("mine", passive=True),
    "consume": lambda channel: channel.basic_consume("mine"),
    "bind": lambda channel: channel.queue_bind("mine", "amq.direct", "k"),
    "unbind": lambda channel: channel.queue_unbind("mine", "amq.direct", "k"),
    "purge": lambda channel: channel.queue_purge("mine"),
    "delete": lambda channel: channel.queue_delete("mine"),
    "get": lambda channel: channel.basic_get("mine"),
}


@pytest.mark.parametrize("use", EXCLUSIVE_QUEUE_USES.values(), ids=EXCLUSIVE_QUEUE_USES.keys())
def test_exclusive_queue_is_locked_to_other_connections(broker, vhost, use):
    owner, _ = open_channel(broker)
    owner.queue_declare("mine", exclusive=True)
    owner.queue_bind("mine", "amq.direct", "k")  # unbind is refused only for a binding that exists
    owner.basic_publish("", "mine", properties(), b"kept")
    other, _ = open_channel(broker)
    with pytest.raises(ResourceLocked) as caught:
        use(other)
    assert caught.value.reply_code == 405
    assert "'mine'" in caught.value.text
    assert vhost.queues["mine"].message_count == 1
    use(owner)  # the owner may do all of it


def test_exclusive_queue_cannot_be_redeclared_shared_by_another_connection(broker):
    owner, _ = open_channel(broker)
    owner.queue_declare("mine", exclusive=True)
    other, _ = open_channel(broker)
    with pytest.raises(ResourceLocked) as caught:
        other.queue_declare("mine")
    assert caught.value.reply_code == 405


def test_other_connections_may_publish_to_an_exclusive_queue(broker, vhost):
    owner, _ = open_channel(broker)
    owner.queue_declare("mine", exclusive=True)
    other, _ = open_channel(broker)
    other.basic_publish("", "mine", properties(), b"hello")
    assert vhost.queues["mine"].message_count == 1


def test_exclusive_queue_goes_with_its_connection(broker, vhost):
    owner, _ = open_channel(broker)
    owner.queue_declare("mine", exclusive=True)
    server_named, _, _ = owner.queue_declare("", exclusive=True)
    owner.connection.close()
    assert "mine" not in vhost.queues and server_named not in vhost.queues
    other, _ = open_channel(broker)
    assert other.queue_declare("mine", exclusive=True)[0] == "mine"


def test_exclusive_queue_stays_while_its_connection_lives(broker, vhost):
    owner, _ = open_channel(broker)
    owner.queue_declare("mine", exclusive=True)
    owner.connection.close_channel(owner.id)
    assert "mine" in vhost.queues


# -- auto-delete


def test_auto_delete_queue_waits_for_its_first_consumer(broker, vhost):
    channel, _ = open_channel(broker)
    channel.queue_declare("temp", auto_delete=True)
    channel.basic_cancel("never-existed")
    assert "temp" in vhost.queues


def test_auto_delete_queue_goes_with_its_last_consumer(broker, vhost):
    channel, _ = open_channel(broker)
    channel.queue_declare("temp", auto_delete=True)
    first = channel.basic_consume("temp")
    second = channel.basic_consume("temp")
    channel.basic_cancel(first)
    assert "temp" in vhost.queues
    channel.basic_cancel(second)
    assert "temp" not in vhost.queues


def test_auto_delete_queue_goes_when_its_consumers_channel_closes(broker, vhost):
    channel, _ = open_channel(broker)
    channel.queue_declare("temp", auto_delete=True)
    channel.basic_consume("temp")
    channel.connection.close_channel(channel.id)
    assert "temp" not in vhost.queues


def test_auto_delete_exchange_goes_with_its_last_binding(vhost):
    vhost.declare_exchange("temp", "direct", auto_delete=True)
    vhost.declare_queue("q1")
    vhost.declare_queue("q2")
    vhost.bind("q1", "temp", "k")
    vhost.bind("q2", "temp", "k")
    vhost.unbind("q1", "temp", "k")
    assert "temp" in vhost.exchanges
    vhost.delete_queue("q2")  # removing the last binding by deleting its queue
    assert "temp" not in vhost.exchanges


def test_auto_delete_exchange_without_bindings_stays(vhost):
    vhost.declare_exchange("temp", "direct", auto_delete=True)
    vhost.declare_queue("q")
    vhost.unbind("q", "temp", "k")
    assert "temp" in vhost.exchanges


# -- what the store holds


def test_durable_topology_is_written_to_the_store(vhost):
    vhost.declare_exchange("ex", "topic", durable=True)
    vhost.declare_queue("q", durable=True)
    vhost.bind("q", "ex", "a.*")
    vhost.bind("q", "amq.direct", "k")
    assert stored_topology(vhost.store) == {
        ("exchange", "ex"),
        ("queue", "q"),
        ("binding", "ex", "q", "a.*"),
        ("binding", "amq.direct", "q", "k"),
    }
    vhost.unbind("q", "ex", "a.*")
    assert ("binding", "ex", "q", "a.*") not in stored_topology(vhost.store)


def test_transient_topology_is_not_written_to_the_store(vhost):
    vhost.declare_exchange("transient-ex", "direct")
    vhost.declare_exchange("durable-ex", "direct", durable=True)
    vhost.declare_queue("transient-q")
    vhost.declare_queue("durable-q", durable=True)
    vhost.bind("durable-q", "transient-ex", "k")  # one end transient: the binding is too
    vhost.bind("transient-q", "durable-ex", "k")
    assert stored_topology(vhost.store) == {("exchange", "durable-ex"), ("queue", "durable-q")}


def test_durable_queue_delete_forgets_it_and_its_messages_in_the_store(vhost):
    vhost.declare_queue("q", durable=True)
    publish(vhost, "", "q", persistent=True)
    assert vhost.store.stats()["messages"] == 1
    vhost.delete_queue("q")
    assert stored_topology(vhost.store) == set()
    assert vhost.store.stats()["messages"] == 0


def test_exclusive_queue_is_not_written_to_the_store(broker, vhost):
    owner, _ = open_channel(broker)
    owner.queue_declare("mine", durable=True, exclusive=True)
    assert stored_topology(vhost.store) == set()


def test_binding_of_exclusive_queue_is_not_written_to_the_store(broker, vhost):
    owner, _ = open_channel(broker)
    owner.queue_declare("mine", durable=True, exclusive=True)
    owner.queue_bind("mine", "amq.direct", "k")
    owner.connection.close()
    assert stored_topology(vhost.store) == set(), "a binding to a queue the store never held outlived the queue"


def test_exclusive_queue_leaves_no_messages_in_the_store(broker, vhost):
    owner, _ = open_channel(broker)
    owner.queue_declare("mine", durable=True, exclusive=True)
    owner.basic_publish("", "mine", properties(persistent=True), b"m")
    owner.connection.close()
    assert "mine" not in vhost.queues
    assert vhost.store.stats()["messages"] == 0, "the deleted exclusive queue's message stayed in the store"
