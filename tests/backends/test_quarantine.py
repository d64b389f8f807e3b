"""One record a store cannot read back never stops the broker: it is
quarantined (named in the log, not served, kept on disk) and everything else
is recovered and served, on every durable backend. The records are written
by the store's own code (L{tests.support.poisoned_state}); the broker recovers them
in-process here, and as a real twistd process in L{tests.backends.test_quarantine_restart}."""

import os
import shutil
import tempfile

from twisted.internet import defer, reactor, task
from twisted.logger import globalLogPublisher
from twisted.trial import unittest

from backends.common.quarantine import QUARANTINE_DIRECTORY, quarantined_topology
from brokerd.errors import NotFound
from brokerd.proto import messages_pb2
from brokerd.storage import registry
from tests.support import poisoned_state as state
from tests.support.broker import make_broker, open_channel
from tests.support.logs import LogWatcher

DEADLINE_SECONDS = 10


class QuarantineContract:
    """Mixed into a trial TestCase; the subclass names its C{backend} and how it keeps a poisoned message."""

    backend = None

    def setUp(self):
        self.data_dir = tempfile.mkdtemp(prefix="brokerd-quarantine-test-")
        self.addCleanup(shutil.rmtree, self.data_dir, True)
        self.log = LogWatcher(self)
        self.failures = []
        observe = self.failures.append

        def keep_failures(event):
            if "log_failure" in event:
                observe(event)

        globalLogPublisher.addObserver(keep_failures)
        self.addCleanup(globalLogPublisher.removeObserver, keep_failures)

    @defer.inlineCallbacks
    def open_store(self):
        store = registry.make_store(self.backend, self.data_dir, reactor=reactor)
        yield store.open()
        self.addCleanup(lambda: defer.maybeDeferred(store.close).addErrback(lambda _: None))
        return store

    @defer.inlineCallbacks
    def poisoned_store_reopened(self, delayed=True, topology=True):
        store = yield self.open_store()
        yield state.write_poisoned_state(store, delayed, topology)
        yield store.close()
        store = yield self.open_store()
        return store

    @staticmethod
    def drain(channel, queue):
        bodies = []
        while (got := channel.basic_get(queue)) is not None:
            delivery_tag, _redelivered, message, _left = got
            bodies.append(message.body)
            channel.basic_ack(delivery_tag)
        return bodies

    @defer.inlineCallbacks
    def wait_for_messages(self, queue, clock):
        """Tick the broker's clock until C{queue} holds a message (delayed messages load on the writer thread)."""
        deadline = reactor.seconds() + DEADLINE_SECONDS
        while queue.message_count == 0 and reactor.seconds() < deadline:
            clock.advance(0.01)
            yield task.deferLater(reactor, 0.01, lambda: None)

    @defer.inlineCallbacks
    def test_a_record_that_cannot_be_read_is_quarantined_and_everything_else_is_served(self):
        store = yield self.poisoned_store_reopened()
        broker, clock = make_broker(store)
        counts = broker.recover()
        self.addCleanup(broker.stop)
        vhost = broker.vhost("/")
        self.assertEqual(counts["quarantined"], 3)
        self.assertIn(state.EVENTS, vhost.exchanges)
        self.assertIn(state.LATER, vhost.exchanges)
        self.assertNotIn(state.POISON_EXCHANGE, vhost.exchanges)
        channel, _ = open_channel(broker)
        self.assertEqual(self.drain(channel, state.JOBS), state.JOB_BODIES)
        self.assertEqual(self.drain(channel, state.AUDIT), state.AUDIT_BODIES)
        # The quarantined queue keeps its name, unavailable, as a queue whose data is down.
        poisoned = vhost.queues[state.POISON_QUEUE]
        self.assertIsNotNone(poisoned.unavailable)
        self.assertRaises(NotFound, channel.basic_get, state.POISON_QUEUE)
        # Bindings that can be read still route; the quarantined one is gone.
        audit = vhost.queues[state.AUDIT]
        self.assertEqual([binding.routing_key for binding in audit.bindings], [state.AUDIT])
        yield self.wait_for_messages(vhost.queues[state.DELAYED_OUT], clock)
        self.assertEqual(self.drain(channel, state.DELAYED_OUT), state.DELAYED_BODIES)

        self.assertTrue(self.log.matching("quarantined exchange 'poison-x'"), self.log.texts)
        self.assertTrue(self.log.matching("quarantined queue 'poison-q'", "unavailable"), self.log.texts)
        self.assertTrue(self.log.matching("quarantined the binding", "'poison-rk'"), self.log.texts)
        self.assertTrue(self.log.matching("'jobs'", "quarantined", "message"), self.log.texts)
        self.assertTrue(self.log.matching("delayed message", "quarantined"), self.log.texts)
        self.assertEqual(self.failures, [], "no traceback in the log")
        yield self.assert_poisoned_message_kept(store)

    @defer.inlineCallbacks
    def test_an_unreadable_message_is_quarantined_and_the_rest_of_its_queue_is_served(self):
        store = yield self.poisoned_store_reopened(topology=False)
        broker, clock = make_broker(store)
        counts = broker.recover()
        self.addCleanup(broker.stop)
        self.assertEqual(counts["unavailable"], 0)
        channel, _ = open_channel(broker)
        self.assertEqual(self.drain(channel, state.JOBS), state.JOB_BODIES)
        self.assertIsNone(broker.vhost("/").queues[state.JOBS].unavailable)
        self.assertEqual(self.drain(channel, state.POISON_QUEUE), state.POISON_QUEUE_BODIES)
        yield self.wait_for_messages(broker.vhost("/").queues[state.DELAYED_OUT], clock)
        self.assertEqual(self.drain(channel, state.DELAYED_OUT), state.DELAYED_BODIES)
        self.assertTrue(self.log.matching("'jobs'", "quarantined stored message"), self.log.texts)
        self.assertEqual(self.failures, [], "no traceback in the log")

    @defer.inlineCallbacks
    def test_a_record_whose_values_the_broker_refuses_is_quarantined(self):
        store = yield self.open_store()
        yield state.write_poisoned_state(store, delayed=False, topology=False)
        store.save_exchange(messages_pb2.ExchangeRecord(vhost="/", name="odd-x", type=99, durable=True))
        odd = messages_pb2.QueueRecord(vhost="/", name="odd-q", durable=True)
        odd.arguments.fields.add(name="x-overflow").value.string_value = "bogus"
        store.save_queue(odd)
        store.append(state.persistent_message("", "odd-q", b"o1"), [("/", "odd-q")])
        yield store.sync()
        yield store.close()
        store = yield self.open_store()
        broker, _ = make_broker(store)
        counts = broker.recover()
        broker.stop()
        self.assertEqual(counts["quarantined"], 2)
        vhost = broker.vhost("/")
        self.assertNotIn("odd-x", vhost.exchanges)
        self.assertIsNotNone(vhost.queues["odd-q"].unavailable)
        channel, _ = open_channel(broker)
        self.assertEqual(self.drain(channel, state.JOBS), state.JOB_BODIES)
        self.assertTrue(self.log.matching("quarantined exchange 'odd-x'", "cannot be taken"), self.log.texts)
        self.assertTrue(self.log.matching("quarantined queue 'odd-q'", "x-overflow"), self.log.texts)
        self.assertEqual(self.failures, [])
        yield store.sync()
        yield store.close()
        store = yield self.open_store()  # its message is kept for it
        self.assertEqual([record.body for _, record, _ in store.recover(("/", "odd-q"))], [b"o1"])

    @defer.inlineCallbacks
    def test_a_queue_that_loads_its_messages_at_recovery_quarantines_only_the_unreadable_one(self):
        store = yield self.open_store()
        ranked = messages_pb2.QueueRecord(vhost="/", name="ranked", durable=True)
        ranked.arguments.fields.add(name="x-max-priority").value.integer_value = 5
        store.save_queue(ranked)  # a priority queue sees every message at recovery (no paging)
        for body, poisoned in ((b"r1", False), (b"r2", True), (b"r3", False)):
            store.append(state.persistent_message("", "ranked", body, poisoned), [("/", "ranked")])
        yield store.sync()
        yield store.close()
        store = yield self.open_store()
        broker, _ = make_broker(store)
        counts = broker.recover()
        broker.stop()
        self.assertEqual(counts["unavailable"], 0)
        channel, _ = open_channel(broker)
        self.assertEqual(self.drain(channel, "ranked"), [b"r1", b"r3"])
        self.assertTrue(self.log.matching("'ranked'", "quarantined stored message"), self.log.texts)
        self.assertEqual(self.failures, [])

    @defer.inlineCallbacks
    def test_the_data_of_a_quarantined_queue_is_kept_until_its_record_is_repaired(self):
        store = yield self.poisoned_store_reopened(delayed=False)
        broker, _ = make_broker(store)
        broker.recover()
        broker.stop()
        yield store.sync()  # after the delayed-message window recovery asked for
        yield store.close()
        store = yield self.open_store()  # a second restart: nothing of the quarantined queue was cleaned up
        self.assertEqual(len([record for record in store.topology() if isinstance(record, messages_pb2.QueueRecord)]),
                         3)
        store.save_queue(messages_pb2.QueueRecord(vhost="/", name=state.POISON_QUEUE, durable=True))
        yield store.sync()
        yield store.close()
        store = yield self.open_store()
        recovered = [record.body for _, record, _ in store.recover(("/", state.POISON_QUEUE))]
        self.assertEqual(recovered, state.POISON_QUEUE_BODIES)
        self.assertEqual(self.failures, [])

    @defer.inlineCallbacks
    def test_deleting_a_quarantined_queue_drops_its_data(self):
        store = yield self.poisoned_store_reopened(delayed=False)
        broker, _ = make_broker(store)
        broker.recover()
        broker.stop()
        broker.vhost("/").delete_queue(state.POISON_QUEUE)
        yield store.sync()
        yield store.close()
        store = yield self.open_store()
        self.assertFalse([record for record in store.topology() if getattr(record, "name", None) == state.POISON_QUEUE])
        store.save_queue(messages_pb2.QueueRecord(vhost="/", name=state.POISON_QUEUE, durable=True))
        yield store.sync()
        self.assertEqual(list(store.recover(("/", state.POISON_QUEUE))), [])

    @defer.inlineCallbacks
    def test_an_unreadable_exchange_to_exchange_binding_is_named_and_goes_with_its_destination(self):
        store = yield self.open_store()
        for name in ("upstream", "downstream"):
            store.save_exchange(messages_pb2.ExchangeRecord(vhost="/", name=name, type=messages_pb2.FANOUT,
                                                            durable=True))
        record = messages_pb2.BindingRecord(vhost="/", exchange="upstream", destination_exchange="downstream",
                                            routing_key="poison-e2e")
        record.arguments.CopyFrom(state.deep_arguments())
        store.save_binding(record)
        yield store.sync()
        yield store.close()
        store = yield self.open_store()
        broker, _ = make_broker(store)
        self.assertEqual(broker.recover()["quarantined"], 1)
        broker.stop()
        self.assertTrue(self.log.matching(
            "quarantined the binding of exchange 'upstream' to exchange 'downstream' with routing key 'poison-e2e'"),
            self.log.texts)
        broker.vhost("/").delete_exchange("downstream")
        yield store.sync()
        yield store.close()
        store = yield self.open_store()
        self.assertEqual([type(record).__name__ for record in store.topology()], ["ExchangeRecord"])

    def assert_poisoned_message_kept(self, store):
        """Where the backend keeps the poisoned message after quarantining it."""
        raise NotImplementedError


class KeptInPlace:
    """The backend keeps a quarantined message where it was: the next restart finds (and names) it again."""

    @defer.inlineCallbacks
    def assert_poisoned_message_kept(self, store):
        yield store.close()
        before = len(self.log.matching("quarantined", "message"))
        store = yield self.open_store()
        self.assertEqual(list(store.recover(("/", state.JOBS))), [])
        self.assertGreater(len(self.log.matching("quarantined", "message")), before)


class SqliteQuarantineTests(KeptInPlace, QuarantineContract, unittest.TestCase):
    backend = "sqlite"


class FilelogQuarantineTests(KeptInPlace, QuarantineContract, unittest.TestCase):
    backend = "filelog"


class ChunkedQuarantineTests(QuarantineContract, unittest.TestCase):
    backend = "chunked:chunk_size=64K"

    @defer.inlineCallbacks
    def assert_poisoned_message_kept(self, store):
        """A copy of the record in the quarantine directory (the queue lets go of it, so its chunk can go)."""
        yield store.sync()
        directory = os.path.join(store.directory, QUARANTINE_DIRECTORY)
        copies = [os.path.join(directory, name) for name in os.listdir(directory)]
        self.assertEqual(len(copies), 2, copies)  # the queue's message and the delayed one
        for path in copies:
            with open(path, "rb") as copy:
                self.assertIn(state.POISON_BODY, copy.read())
        yield store.close()
        store = yield self.open_store()
        self.assertEqual(list(store.recover(("/", state.JOBS))), [])


def test_a_quarantined_record_is_named_from_its_top_level_fields_without_parsing_the_rest():
    record = messages_pb2.BindingRecord(vhost="v", exchange="e", queue="q", routing_key="k")
    record.arguments.CopyFrom(state.deep_arguments())
    named = quarantined_topology(messages_pb2.BindingRecord, record.SerializeToString(), "here")
    assert (named.kind, named.vhost, named.name, named.where) == ("binding", "v", ("e", "q", "k"), "here")
    record = messages_pb2.BindingRecord(vhost="v", exchange="e", destination_exchange="d")  # no queue, no key
    record.arguments.CopyFrom(state.deep_arguments())
    named = quarantined_topology(messages_pb2.BindingRecord, record.SerializeToString(), "here")
    assert (named.kind, named.vhost, named.name) == ("binding", "v", ("e", "", "", "d"))
    garbage = quarantined_topology(messages_pb2.QueueRecord, b"\x12\xff\xff\xff", "there")
    assert (garbage.kind, garbage.vhost, garbage.name) == ("queue", None, None)
