"""Durable state with records that cannot be read back, written by the store's
own code: protobuf parses at most 100 nested messages (3 per table level,
counted from the record's root), and a field table some 33 levels deep
serialises fine inside a record and is built from parts that parse, so a
store writes it as it writes anything, and only reading it back fails.

L{write_poisoned_state} fills an open store: ordinary exchanges, queues,
bindings, messages and delayed messages around one poisoned exchange, queue,
binding, message (in the middle of a queue) and delayed message. The expected
names and bodies are the module's constants.

Run as ``python -m tests.support.poisoned_state BACKEND DATA_DIR``, this module writes
that state into a stopped broker's data directory (a store needs a running
reactor, which runs once per process).
"""

import argparse
import sys

from twisted.internet import defer, task

from brokerd.model.message import Message
from brokerd.proto import messages_pb2
from brokerd.storage import registry

DURABLE_BACKENDS = ("sqlite", "filelog", "chunked")

EVENTS, POISON_EXCHANGE, LATER = "events", "poison-x", "later"
JOBS, AUDIT, POISON_QUEUE, DELAYED_OUT = "jobs", "audit", "poison-q", "delayed-out"
POISON_ROUTING_KEY = "poison-rk"
JOB_BODIES = [b"m1", b"m2", b"m3", b"m4"]  # the poisoned message sits between m2 and m3
POISON_BODY = b"poisoned"
AUDIT_BODIES = [b"a1"]
POISON_QUEUE_BODIES = [b"p1"]
DELAYED_BODIES = [b"d1"]


def _deep_table(levels, leaf):
    """A FieldTable nested C{levels} tables deep, C{leaf(value)} setting the innermost value; built as
    protobuf messages (protobuf's constructors would parse a table this deep, and refuse it)."""
    table = messages_pb2.FieldTable()
    inner = table
    for _ in range(levels - 1):
        inner = inner.fields.add(name="a").value.table_value
    leaf(inner.fields.add(name="a").value)
    return table


def deep_arguments():
    """
    Declare arguments as the issue found them, C{{"x-a": {"a": ... [[None]]}}}
    32 tables deep: a store writes a record holding them (its own code builds
    and serialises it), and protobuf cannot parse that record back.
    """
    def innermost(value):
        value.array_value.values.add().array_value.values.add().void_value.SetInParent()

    return _deep_table(32, innermost)


def deep_headers():
    """Headers 33 tables deep ending in a void: a store writes the message, and cannot parse it back."""
    return _deep_table(33, lambda value: value.void_value.SetInParent())


def persistent_message(exchange, routing_key, body, poisoned=False):
    """A persistent message (with headers nested too deep if C{poisoned}), its message id its body."""
    properties = messages_pb2.BasicProperties(delivery_mode=messages_pb2.PERSISTENT, message_id=body.decode())
    if poisoned:
        properties.headers.CopyFrom(deep_headers())
    return Message(exchange, routing_key, properties, body)


def _poisoned(record):
    """C{record} with its arguments nested too deep (copied in: protobuf's constructor would parse them)."""
    record.arguments.CopyFrom(deep_arguments())
    return record


def write_poisoned_state(store, delayed=True, topology=True):
    """
    Persist the ordinary and the poisoned topology (only the ordinary one
    unless C{topology}), messages and (if C{delayed}) delayed messages
    through C{store}'s API; returns C{store.sync()}.
    """
    store.save_exchange(messages_pb2.ExchangeRecord(vhost="/", name=EVENTS, type=messages_pb2.DIRECT, durable=True))
    poisoned = _poisoned if topology else (lambda record: record)
    store.save_exchange(poisoned(messages_pb2.ExchangeRecord(vhost="/", name=POISON_EXCHANGE,
                                                              type=messages_pb2.DIRECT, durable=True)))
    delayed_type = messages_pb2.ExchangeRecord(vhost="/", name=LATER, type=messages_pb2.DELAYED_MESSAGE, durable=True)
    delayed_type.arguments.fields.add(name="x-delayed-type").value.string_value = "direct"
    store.save_exchange(delayed_type)
    for name in (JOBS, AUDIT, DELAYED_OUT):
        store.save_queue(messages_pb2.QueueRecord(vhost="/", name=name, durable=True))
    store.save_queue(poisoned(messages_pb2.QueueRecord(vhost="/", name=POISON_QUEUE, durable=True)))
    for exchange, queue, routing_key in ((EVENTS, JOBS, JOBS), (EVENTS, AUDIT, AUDIT), (LATER, DELAYED_OUT, LATER)):
        store.save_binding(messages_pb2.BindingRecord(vhost="/", exchange=exchange, queue=queue,
                                                      routing_key=routing_key))
    store.save_binding(poisoned(messages_pb2.BindingRecord(vhost="/", exchange=EVENTS, queue=AUDIT,
                                                            routing_key=POISON_ROUTING_KEY)))
    jobs = ("/", JOBS)
    for body in JOB_BODIES[:2]:
        store.append(persistent_message(EVENTS, JOBS, body), [jobs])
    store.append(persistent_message(EVENTS, JOBS, POISON_BODY, poisoned=True), [jobs])
    for body in JOB_BODIES[2:]:
        store.append(persistent_message(EVENTS, JOBS, body), [jobs])
    for body in AUDIT_BODIES:
        store.append(persistent_message(EVENTS, AUDIT, body), [("/", AUDIT)])
    for body in POISON_QUEUE_BODIES:
        store.append(persistent_message("", POISON_QUEUE, body), [("/", POISON_QUEUE)])
    if not delayed:
        return store.sync()
    # Overdue at once, wherever the clock stands: the poisoned one first, then the ordinary one.
    store.delay(persistent_message(LATER, LATER, POISON_BODY, poisoned=True), ("/", LATER), 1)
    for body in DELAYED_BODIES:
        store.delay(persistent_message(LATER, LATER, body), ("/", LATER), 2)
    return store.sync()


@defer.inlineCallbacks
def _child(reactor, arguments):
    store = registry.make_store(arguments.backend, arguments.data_dir, reactor=reactor)
    yield store.open()
    try:
        yield write_poisoned_state(store, topology=not arguments.messages_only)
    finally:
        yield store.close()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m tests.support.poisoned_state",
                                     description="Write durable state holding unreadable records into a data dir.")
    parser.add_argument("backend", choices=DURABLE_BACKENDS)
    parser.add_argument("data_dir")
    parser.add_argument("--messages-only", action="store_true", help="poison messages only, not the topology")
    task.react(_child, (parser.parse_args(argv),))


if __name__ == "__main__":
    main(sys.argv[1:])
