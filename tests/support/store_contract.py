"""The store contract, written once: every backend's test module subclasses
L{StoreContract} (and L{tests.support.store_contract_durable.DurableStoreContract},
what a restart finds) with a few lines saying how to make and reopen its store."""

import os
import shutil
import tempfile
import unittest

from twisted.internet import defer, reactor
from zope.interface.verify import verifyObject

from brokerd.interfaces import IDelayedMessageStore, IMessageStore, IPagingStore, MessageRecord
from brokerd.model.message import Message
from brokerd.proto import messages_pb2
from brokerd.proto.tables import dict_to_table, table_to_dict
from brokerd.storage.durability import SyncPolicy

JOBS = ("/", "jobs")
AUDIT = ("/", "audit")
FOREVER = (1 << 63) - 1  # a due time after every delayed message's
NOW = 1_760_000_000_000  # a due time of about now, in milliseconds since the epoch


def message(body, routing_key="jobs", **headers):
    properties = messages_pb2.BasicProperties(delivery_mode=messages_pb2.PERSISTENT, message_id=body.decode())
    if headers:
        dict_to_table(headers, properties.headers)
    return Message("amq.direct", routing_key, properties, body)


def record_fields(record):
    """The fields of a L{MessageRecord}, read from any object that has them (a record or a message)."""
    return tuple(getattr(record, field) for field in MessageRecord._fields)


def queue_record(name, vhost="/", **arguments):
    return messages_pb2.QueueRecord(vhost=vhost, name=name, durable=True, arguments=dict_to_table(arguments))


def exchange_record(name, type_=messages_pb2.TOPIC, vhost="/", **arguments):
    return messages_pb2.ExchangeRecord(
        vhost=vhost, name=name, type=type_, durable=True, arguments=dict_to_table(arguments)
    )


def binding_record(exchange, queue, routing_key, vhost="/", **arguments):
    return messages_pb2.BindingRecord(
        vhost=vhost, exchange=exchange, queue=queue, routing_key=routing_key, arguments=dict_to_table(arguments)
    )


def exchange_binding_record(source, destination, routing_key, vhost="/", **arguments):
    """The record of a binding from exchange C{source} to exchange C{destination}."""
    return messages_pb2.BindingRecord(
        vhost=vhost, exchange=source, destination_exchange=destination, routing_key=routing_key,
        arguments=dict_to_table(arguments),
    )


def binding_ends(store):
    """(source, queue, destination exchange, routing key) of each binding C{store} holds, sorted."""
    return sorted((record.exchange, record.queue, record.destination_exchange, record.routing_key)
                  for record in store.topology() if isinstance(record, messages_pb2.BindingRecord))


class DirectoryStores:
    """
    Mixed into a trial TestCase: makes stores of C{backend} on fresh or
    existing data directories (closed at test cleanup), for backends that
    keep their files in C{<data dir>/<subdirectory>}.
    """

    backend = None
    subdirectory = None
    options = {}
    sync_policy = SyncPolicy()

    def fresh_data_dir(self):
        data_dir = tempfile.mkdtemp(prefix=f"brokerd-{self.subdirectory}-test-")
        self.addCleanup(shutil.rmtree, data_dir, True)
        return data_dir

    def make_store(self, data_dir=None, **options):
        return self.backend.make_store(
            data_dir or self.fresh_data_dir(), self.sync_policy, reactor=reactor, **{**self.options, **options}
        )

    @staticmethod
    def data_dir_of(store):
        return os.path.dirname(store.directory)

    @defer.inlineCallbacks
    def open_store(self, data_dir=None, **options):
        store = self.make_store(data_dir, **options)
        self.addCleanup(store.close)
        yield store.open()
        return store

    @defer.inlineCallbacks
    def reopen(self, store, **options):
        yield store.close()
        reopened = yield self.open_store(self.data_dir_of(store), **options)
        return reopened

    def reopen_after_crash(self, store):
        # The files as they are now, copied while the store stays open (it holds
        # their lock), are what a broker restarted after a crash would find.
        crashed = self.fresh_data_dir()
        shutil.copytree(store.directory, os.path.join(crashed, self.subdirectory))
        return self.open_store(crashed)


class OpensStores:
    """
    How the contract suites open, restart and close the stores that the
    test case's C{make_store()}, C{reopen(store)} and C{reopen_after_crash(store)} give.
    """

    @defer.inlineCallbacks
    def opened(self):
        store = self.make_store()
        yield store.open()
        self.addCleanup(lambda: self._close_quietly(store))
        return store

    @staticmethod
    def _close_quietly(store):
        return defer.maybeDeferred(store.close).addErrback(lambda _: None)

    @defer.inlineCallbacks
    def restarted(self, store, crash=False):
        """Sync, then reopen (or, with C{crash}, open the data beside the store left running): what a
        client would find after a restart."""
        yield store.sync()
        reopened = yield (self.reopen_after_crash(store) if crash else self.reopen(store))
        if reopened is not store:
            self.addCleanup(lambda: self._close_quietly(reopened))
        return reopened

    def reopen_after_crash(self, store):
        raise NotImplementedError(
            f"{type(self).__name__} must define reopen_after_crash(store) for the durable tests: a second"
            " store opened on the data of store, which stays open"
        )

    @staticmethod
    def recovered_bodies(store, queue):
        return [record.body for _, record, _ in store.recover(queue)]

    @defer.inlineCallbacks
    def opened_durable(self):
        """An opened store, or a skip if the store keeps nothing across a restart."""
        store = yield self.opened()
        if not store.durable:
            raise unittest.SkipTest(f"the {store.name} store is not durable: nothing of it outlives a restart")
        return store


class StoreContract(OpensStores):
    """
    Mixed into a C{twisted.trial.unittest.TestCase}; the subclass provides:

      - C{make_store()}: a new, unopened store with its own empty data.
      - C{reopen(store)}: a Deferred firing with a store opened on what
        C{store} persisted (after C{store} is closed, or after a simulated
        crash for durable stores). For a store that is not durable, the same
        object stands for itself.
      - for durable stores, C{reopen_after_crash(store)}: a Deferred firing
        with a second store opened on C{store}'s data while C{store} stays
        open and is never closed first, as a broker restarted after a crash
        would find it.

    What only a durable store promises (restarts, crashes) is in
    L{tests.support.store_contract_durable.DurableStoreContract}.
    """

    timeout = 30

    # -- the interface

    @defer.inlineCallbacks
    def test_provides_the_store_interface(self):
        store = yield self.opened()
        self.assertTrue(verifyObject(IMessageStore, store))
        self.assertIsInstance(store.name, str)
        self.assertIsInstance(store.durable, bool)

    @defer.inlineCallbacks
    def test_a_new_store_is_empty(self):
        store = yield self.opened()
        self.assertEqual(list(store.topology()), [])
        self.assertEqual(list(store.recover(JOBS)), [])

    # -- topology

    @defer.inlineCallbacks
    def test_topology_comes_back_with_its_arguments(self):
        store = yield self.opened()
        store.save_exchange(exchange_record("events", **{"alternate-exchange": "unrouted"}))
        store.save_queue(queue_record("jobs", **{"x-max-priority": 5}))
        store.save_binding(binding_record("events", "jobs", "job.#"))
        store = yield self.restarted(store)
        records = list(store.topology())
        exchanges = [r for r in records if isinstance(r, messages_pb2.ExchangeRecord)]
        queues = [r for r in records if isinstance(r, messages_pb2.QueueRecord)]
        bindings = [r for r in records if isinstance(r, messages_pb2.BindingRecord)]
        self.assertEqual([(e.name, e.type) for e in exchanges], [("events", messages_pb2.TOPIC)])
        self.assertEqual(table_to_dict(exchanges[0].arguments), {"alternate-exchange": "unrouted"})
        self.assertEqual([q.name for q in queues], ["jobs"])
        self.assertEqual(table_to_dict(queues[0].arguments), {"x-max-priority": 5})
        self.assertEqual([(b.exchange, b.queue, b.routing_key) for b in bindings], [("events", "jobs", "job.#")])

    @defer.inlineCallbacks
    def test_bindings_come_after_what_they_refer_to(self):
        store = yield self.opened()
        store.save_queue(queue_record("jobs"))
        store.save_exchange(exchange_record("events"))
        store.save_binding(binding_record("events", "jobs", "a"))
        store.save_queue(queue_record("late"))
        store.save_binding(binding_record("events", "late", "b"))
        store = yield self.restarted(store)
        kinds = [type(record).__name__ for record in store.topology()]
        first_binding = kinds.index("BindingRecord")
        self.assertNotIn("QueueRecord", kinds[first_binding:])
        self.assertNotIn("ExchangeRecord", kinds[first_binding:])

    @defer.inlineCallbacks
    def test_deleted_topology_stays_deleted(self):
        store = yield self.opened()
        store.save_exchange(exchange_record("events"))
        store.save_exchange(exchange_record("gone"))
        store.save_queue(queue_record("jobs"))
        store.save_binding(binding_record("events", "jobs", "a"))
        store.save_binding(binding_record("events", "jobs", "b"))
        store.save_binding(binding_record("gone", "jobs", "c"))
        store.delete_binding(binding_record("events", "jobs", "a"))
        store.delete_exchange("/", "gone")
        store = yield self.restarted(store)
        names = sorted(
            (type(r).__name__, getattr(r, "name", "") or getattr(r, "routing_key", "")) for r in store.topology()
        )
        self.assertEqual(names, [("BindingRecord", "b"), ("ExchangeRecord", "events"), ("QueueRecord", "jobs")])

    @defer.inlineCallbacks
    def test_exchange_to_exchange_bindings_come_back_apart_from_queue_bindings(self):
        store = yield self.opened()
        for name in ("events", "audit", "jobs"):
            store.save_exchange(exchange_record(name))
        store.save_queue(queue_record("jobs"))
        store.save_binding(binding_record("events", "jobs", "k"))  # a queue and an exchange of the same name
        store.save_binding(exchange_binding_record("events", "jobs", "k"))
        store.save_binding(exchange_binding_record("events", "audit", "k", **{"x-match": "any"}))
        store.save_binding(exchange_binding_record("events", "audit", "k"))
        store.save_binding(exchange_binding_record("events", "audit", "k"))  # the same binding again
        store.delete_binding(exchange_binding_record("events", "audit", "k", **{"x-match": "any"}))
        store = yield self.restarted(store)
        self.assertEqual(binding_ends(store), [("events", "", "audit", "k"), ("events", "", "jobs", "k"),
                                               ("events", "jobs", "", "k")])

    @defer.inlineCallbacks
    def test_deleting_an_exchange_forgets_the_bindings_it_is_source_or_destination_of(self):
        store = yield self.opened()
        for name in ("upstream", "middle", "downstream"):
            store.save_exchange(exchange_record(name))
        store.save_queue(queue_record("jobs"))
        store.save_binding(exchange_binding_record("upstream", "middle", "a"))
        store.save_binding(exchange_binding_record("middle", "downstream", "b"))
        store.save_binding(binding_record("middle", "jobs", "c"))
        store.save_binding(exchange_binding_record("upstream", "downstream", "d"))
        store.delete_queue(JOBS)  # a queue of another name goes alone
        store.delete_exchange("/", "middle")
        store = yield self.restarted(store)
        self.assertEqual(binding_ends(store), [("upstream", "", "downstream", "d")])

    @defer.inlineCallbacks
    def test_saving_a_queue_again_replaces_it(self):
        store = yield self.opened()
        store.save_queue(queue_record("jobs", **{"x-message-ttl": 1}))
        store.save_queue(queue_record("jobs", **{"x-message-ttl": 2}))
        store = yield self.restarted(store)
        queues = [r for r in store.topology() if isinstance(r, messages_pb2.QueueRecord)]
        self.assertEqual([table_to_dict(q.arguments) for q in queues], [{"x-message-ttl": 2}])

    @defer.inlineCallbacks
    def test_same_names_in_two_vhosts_are_separate(self):
        store = yield self.opened()
        store.save_queue(queue_record("jobs", vhost="/"))
        store.save_queue(queue_record("jobs", vhost="staging"))
        store.append(message(b"one"), [("staging", "jobs")])
        store.delete_queue(("/", "jobs"))
        store = yield self.restarted(store)
        self.assertEqual([(q.vhost, q.name) for q in store.topology()], [("staging", "jobs")])
        self.assertEqual(self.recovered_bodies(store, ("staging", "jobs")), [b"one"])

    # -- messages

    @defer.inlineCallbacks
    def test_messages_come_back_in_queue_order_with_everything_published(self):
        store = yield self.opened()
        store.save_queue(queue_record("jobs"))
        for number in range(50):
            store.append(message(b"m%d" % number, color="blue", n=number), [JOBS])
        store = yield self.restarted(store)
        recovered = list(store.recover(JOBS))
        self.assertEqual([record.body for _, record, _ in recovered], [b"m%d" % n for n in range(50)])
        first = recovered[0][1]
        self.assertEqual((first.exchange, first.routing_key), ("amq.direct", "jobs"))
        self.assertEqual(first.properties.message_id, "m0")
        self.assertEqual(first.properties.delivery_mode, messages_pb2.PERSISTENT)
        self.assertEqual(table_to_dict(first.properties.headers), {"color": "blue", "n": 0})

    @defer.inlineCallbacks
    def test_read_returns_the_stored_message(self):
        store = yield self.opened()
        store.save_queue(queue_record("jobs"))
        handle = store.append(message(b"payload" * 100), [JOBS])
        yield store.sync()
        record = yield store.read(handle)
        self.assertEqual(record.body, b"payload" * 100)
        self.assertEqual(record.properties.message_id, "payload" * 100)

    @defer.inlineCallbacks
    def test_a_message_reads_back_before_and_after_its_commit(self):
        store = yield self.opened()
        store.save_queue(queue_record("jobs"))
        handle = store.append(message(b"fresh"), [JOBS])
        buffered = yield store.read(handle)
        yield store.sync()
        committed = yield store.read(handle)
        self.assertEqual((buffered.body, committed.body), (b"fresh", b"fresh"))

    @defer.inlineCallbacks
    def test_read_recover_load_and_delayed_after_give_one_record_type_with_equal_fields(self):
        store = yield self.opened()
        store.save_queue(queue_record("jobs"))
        timed = message(b"timed", color="blue")
        timed.published_at = 1_760_000_000_123  # a message with a time to live keeps when it was published
        published = [message(b"plain"), timed]
        expected = [MessageRecord(m.exchange, m.routing_key, m.properties, m.body, m.published_at) for m in published]
        handles = [store.append(m, [JOBS]) for m in published]
        later = message(b"later")
        delaying = IDelayedMessageStore.providedBy(store)
        if delaying:
            store.delay(later, ("/", "delays"), NOW)
        paging = IPagingStore.providedBy(store)

        @defer.inlineCallbacks
        def everything(store, handles):
            """Where each record came from, the record, and whether the method must give a MessageRecord."""
            reads = yield defer.gatherResults([store.read(handle) for handle in handles])
            found = [(f"read {handle}", record, True) for handle, record in zip(handles, reads)]
            if paging:  # load may give the appended object itself while it is unwritten
                found += [(f"load {handle}", store.load(handle), False) for handle in handles]
            if delaying:
                window = yield store.delayed_after(None, FOREVER, 10)
                found += [("delayed_after", item.record, True) for item in window]
            return found

        before = yield everything(store, handles)
        yield store.sync()
        committed = yield everything(store, handles)
        store = yield self.restarted(store)
        recovered = list(store.recover(JOBS))
        handles = [handle for handle, _, _ in recovered]
        if paging:
            self.assertEqual(list(store.recovered_handles(JOBS)), handles)
        after = [("recover", record, True) for _, record, _ in recovered] + (yield everything(store, handles))
        delayed_record = MessageRecord(later.exchange, later.routing_key, later.properties, later.body, None)
        for found, sources in ((before, 1 + paging), (committed, 1 + paging), (after, 2 + paging)):
            records = [record_fields(record) for where, record, _ in found if where != "delayed_after"]
            self.assertEqual(records, [tuple(record) for record in expected] * sources)
            self.assertEqual([record_fields(record) for where, record, _ in found if where == "delayed_after"],
                             [tuple(delayed_record)] if delaying else [])
            for where, record, must_be_record in found:
                if must_be_record or found is after:  # what was written comes back as a record, loads too
                    self.assertIsInstance(record, MessageRecord, f"{where} gave a {type(record).__name__}")

    @defer.inlineCallbacks
    def test_reading_an_unknown_handle_fails_with_key_error(self):
        store = yield self.opened()
        store.save_queue(queue_record("jobs"))
        handle = store.append(message(b"x"), [JOBS])
        store.ack(JOBS, handle)
        yield store.sync()
        bogus = handle + 10_000 if isinstance(handle, int) else object()
        yield self.assertFailure(store.read(bogus), KeyError)

    @defer.inlineCallbacks
    def test_acked_messages_do_not_come_back(self):
        store = yield self.opened()
        store.save_queue(queue_record("jobs"))
        handles = [store.append(message(b"m%d" % n), [JOBS]) for n in range(10)]
        for handle in handles[::2]:
            store.ack(JOBS, handle)
        store = yield self.restarted(store)
        self.assertEqual(self.recovered_bodies(store, JOBS), [b"m1", b"m3", b"m5", b"m7", b"m9"])

    @defer.inlineCallbacks
    def test_a_message_for_two_queues_stays_until_both_ack(self):
        store = yield self.opened()
        store.save_queue(queue_record("jobs"))
        store.save_queue(queue_record("audit"))
        handle = store.append(message(b"shared"), [JOBS, AUDIT])
        store.ack(JOBS, handle)
        store = yield self.restarted(store)
        self.assertEqual(self.recovered_bodies(store, JOBS), [])
        self.assertEqual(self.recovered_bodies(store, AUDIT), [b"shared"])
        (recovered_handle, _, _), = store.recover(AUDIT)
        store.ack(AUDIT, recovered_handle)
        store = yield self.restarted(store)
        self.assertEqual(self.recovered_bodies(store, AUDIT), [])
        self.assertEqual(store.stats()["messages"], 0)

    @defer.inlineCallbacks
    def test_purge_drops_only_the_given_messages(self):
        store = yield self.opened()
        store.save_queue(queue_record("jobs"))
        handles = [store.append(message(b"m%d" % n), [JOBS]) for n in range(6)]
        store.purge(JOBS, handles[2:])  # m0 and m1 were delivered and are not acked yet
        store = yield self.restarted(store)
        self.assertEqual(self.recovered_bodies(store, JOBS), [b"m0", b"m1"])

    @defer.inlineCallbacks
    def test_deleting_a_queue_drops_its_messages_and_bindings(self):
        store = yield self.opened()
        store.save_exchange(exchange_record("events"))
        store.save_queue(queue_record("jobs"))
        store.save_queue(queue_record("audit"))
        store.save_binding(binding_record("events", "jobs", "#"))
        store.append(message(b"only-jobs"), [JOBS])
        store.append(message(b"both"), [JOBS, AUDIT])
        store.delete_queue(JOBS)
        store = yield self.restarted(store)
        self.assertEqual(
            sorted(type(r).__name__ for r in store.topology()), ["ExchangeRecord", "QueueRecord"]
        )
        self.assertEqual(self.recovered_bodies(store, JOBS), [])
        self.assertEqual(self.recovered_bodies(store, AUDIT), [b"both"])

    @defer.inlineCallbacks
    def test_sync_fires_for_many_callers(self):
        store = yield self.opened()
        store.save_queue(queue_record("jobs"))
        syncs = []
        for number in range(20):
            store.append(message(b"m%d" % number), [JOBS])
            syncs.append(store.sync())
        results = yield defer.gatherResults(syncs)
        self.assertEqual(len(results), 20)

    @defer.inlineCallbacks
    def test_stats_count_held_messages_and_bytes(self):
        store = yield self.opened()
        store.save_queue(queue_record("jobs"))
        handles = [store.append(message(b"x" * 100), [JOBS]) for _ in range(4)]
        store.ack(JOBS, handles[0])
        yield store.sync()
        stats = store.stats()
        self.assertEqual(stats["messages"], 3)
        self.assertGreaterEqual(stats["bytes"], 300)
        self.assertTrue(all(isinstance(value, (int, float)) for value in stats.values()))

    @defer.inlineCallbacks
    def test_a_broker_recovers_what_the_store_holds(self):
        from tests.support.broker import make_broker, open_channel, properties

        store = yield self.opened()
        broker, clock = make_broker(store)
        channel, _ = open_channel(broker)
        channel.exchange_declare("events", "topic", durable=True)
        channel.queue_declare("jobs", durable=True)
        channel.queue_declare("scratch", durable=False)
        channel.queue_bind("jobs", "events", "job.*")
        for number in range(3):
            channel.basic_publish("events", "job.new", properties(persistent=True), b"p%d" % number)
        channel.basic_publish("events", "job.new", properties(persistent=False), b"transient")
        store = yield self.restarted(store)
        recovered, _ = make_broker(store)
        counts = recovered.recover()
        vhost = recovered.vhost("/")
        self.assertEqual(counts["messages"], 3)
        self.assertNotIn("scratch", vhost.queues)
        self.assertEqual(vhost.exchanges["events"].type_name, "topic")
        recovered_channel, peer = open_channel(recovered)
        self.assertEqual(
            [recovered_channel.basic_get("jobs")[2].body for _ in range(3)], [b"p0", b"p1", b"p2"]
        )
        recovered_channel.basic_publish("events", "job.done", properties(), b"routed")
        self.assertEqual(recovered_channel.basic_get("jobs")[2].body, b"routed")
