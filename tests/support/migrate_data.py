"""A small data set for migration tests, written through a store's own API,
and a portrait of what a store holds to compare stores of different backends.

    python -m tests.support.migrate_data BACKEND DATA_DIR

writes the set into a fresh store of BACKEND under DATA_DIR (for tests that
then start a real broker on it).

The set: a priority queue, a queue with a message TTL (messages carrying
their publish time), a message stored once for two queues, messages that
came back unacked (delivery counts), a message with headers, and two delayed
messages on an x-delayed-message exchange, one already due and one due in an
hour.
"""

import sys
import time

from twisted.internet import defer, task

from brokerd.interfaces import IPagingStore
from brokerd.model.message import Message
from brokerd.proto import messages_pb2
from brokerd.proto.tables import dict_to_table, table_to_dict
from brokerd.storage import registry

VHOST = "/"
DELAYED_EXCHANGE = "migrate.delayed"
DIRECT_EXCHANGE = "migrate.direct"
PRIORITY, TTL, PLAIN, COPY, LATER = "prio", "ttl", "plain", "copy", "later"
QUEUE_ARGUMENTS = {PRIORITY: {"x-max-priority": 9}, TTL: {"x-message-ttl": 3_600_000}, PLAIN: {}, COPY: {},
                   LATER: {}}
PRIORITIES = [(b"p-low", 1), (b"p-high", 7), (b"p-mid", 4)]  # in publish order
TTL_BODIES = [b"t1", b"t2"]
PLAIN_BODIES = [b"u0", b"s1", b"u2"]  # s1 is stored once for plain and copy
COPY_BODIES = [b"s1", b"c3"]
DELIVERY_COUNTS = {PLAIN: {b"u0": 2, b"s1": 3}, COPY: {b"s1": 1}}
HEADERS = {"who": "migrate", "n": 7}  # on u2
DUE_NOW, DUE_LATER = b"d-due", b"d-later"
HOUR_MS = 3_600_000


def key(name):
    return (VHOST, name)


def persistent(body, routing_key, exchange=DIRECT_EXCHANGE, priority=None, headers=None, published_at=None):
    properties = messages_pb2.BasicProperties(delivery_mode=messages_pb2.PERSISTENT, message_id=body.decode())
    if priority is not None:
        properties.priority = priority
    if headers:
        dict_to_table(headers, properties.headers)
    return Message(exchange, routing_key, properties, body, published_at=published_at)


def write(store, now_ms):
    """Put the data set in an opened store (the caller syncs)."""
    store.save_exchange(messages_pb2.ExchangeRecord(
        vhost=VHOST, name=DELAYED_EXCHANGE, type=messages_pb2.DELAYED_MESSAGE, durable=True,
        arguments=dict_to_table({"x-delayed-type": "direct"})))
    store.save_exchange(messages_pb2.ExchangeRecord(vhost=VHOST, name=DIRECT_EXCHANGE, type=messages_pb2.DIRECT,
                                                    durable=True))
    for name, arguments in QUEUE_ARGUMENTS.items():
        store.save_queue(messages_pb2.QueueRecord(vhost=VHOST, name=name, durable=True,
                                                  arguments=dict_to_table(arguments)))
    for exchange, queue, routing_key in ((DIRECT_EXCHANGE, PLAIN, "shared"), (DIRECT_EXCHANGE, COPY, "shared"),
                                         (DELAYED_EXCHANGE, LATER, LATER)):
        store.save_binding(messages_pb2.BindingRecord(vhost=VHOST, exchange=exchange, queue=queue,
                                                      routing_key=routing_key))
    for body, priority in PRIORITIES:
        store.append(persistent(body, PRIORITY, priority=priority), [key(PRIORITY)])
    for body in TTL_BODIES:
        store.append(persistent(body, TTL, published_at=now_ms), [key(TTL)])
    handles = {
        b"u0": store.append(persistent(b"u0", "shared"), [key(PLAIN)]),
        b"s1": store.append(persistent(b"s1", "shared"), [key(PLAIN), key(COPY)]),
        b"u2": store.append(persistent(b"u2", "shared", headers=HEADERS), [key(PLAIN)]),
        b"c3": store.append(persistent(b"c3", "shared"), [key(COPY)]),
    }
    for queue, counts in DELIVERY_COUNTS.items():
        for body, count in counts.items():
            store.returned(key(queue), handles[body], count)
    store.delay(persistent(DUE_NOW, LATER, DELAYED_EXCHANGE), key(DELAYED_EXCHANGE), now_ms - 1000)
    store.delay(persistent(DUE_LATER, LATER, DELAYED_EXCHANGE), key(DELAYED_EXCHANGE), now_ms + HOUR_MS)


@defer.inlineCallbacks
def write_store(backend, data_dir, now_ms, reactor):
    store = registry.make_store(backend, data_dir, reactor=reactor)
    yield store.open()
    write(store, now_ms)
    yield store.sync()
    yield store.close()


@defer.inlineCallbacks
def portrait(store):
    """
    What an opened store holds, without its handles: C{(topology, queues,
    delayed, shared)} where queues maps each queue name to its messages in
    order as C{(body, priority, headers, published_at, redelivered, count)},
    delayed lists C{(due, exchange, body)} and shared says whether s1 has one
    handle in both its queues.
    """
    topology = sorted((type(record).__name__, record.SerializeToString(deterministic=True))
                      for record in store.topology())
    queues, handles = {}, {}
    for name in QUEUE_ARGUMENTS:
        counts = store.delivery_counts(key(name))
        if IPagingStore.providedBy(store):
            found = [(handle, store.load(handle), True) for handle in store.recovered_handles(key(name))]
        else:
            found = list(store.recover(key(name)))
        queues[name] = [(message.body, message.properties.priority, table_to_dict(message.properties.headers),
                         message.published_at, flag, counts.get(handle, 0)) for handle, message, flag in found]
        handles[name] = {message.body: handle for handle, message, _ in found}
    delayed = yield store.delayed_after(None, (1 << 63) - 1, 100)
    return (topology, queues, [(item.due, item.exchange, item.record.body) for item in delayed],
            handles[PLAIN][b"s1"] == handles[COPY][b"s1"])


def main(argv=None):
    backend, data_dir = (argv or sys.argv)[1:3]
    task.react(lambda reactor: write_store(backend, data_dir, int(time.time() * 1000), reactor))


if __name__ == "__main__":
    main()
