"""The durable half of the store contract, written once: what a restart (or a
crash) finds. Every backend's test module mixes L{DurableStoreContract} into a
TestCase with its store-making mixin, as it does L{StoreContract}; for a store
that is not durable every test here is skipped."""

import threading

from twisted.internet import defer, reactor, task

from brokerd.interfaces import SerializedPropertiesMessage
from brokerd.proto import messages_pb2
from tests.support.store_contract import (
    AUDIT,
    JOBS,
    OpensStores,
    binding_record,
    exchange_record,
    message,
    queue_record,
    record_fields,
)


class DurableStoreContract(OpensStores):
    """
    Mixed into a C{twisted.trial.unittest.TestCase} with what
    L{tests.support.store_contract.StoreContract} needs, C{reopen_after_crash(store)}
    included; the tests run only for stores whose C{durable} is True.
    """

    timeout = 30

    @defer.inlineCallbacks
    def test_a_restart_reads_topology_and_messages_back_from_the_data(self):
        store = yield self.opened_durable()
        store.save_exchange(exchange_record("events"))
        store.save_queue(queue_record("jobs", **{"x-max-length": 100}))
        store.save_queue(queue_record("jobs", vhost="staging"))
        store.save_binding(binding_record("events", "jobs", "job.#"))
        store.append(message(b"one"), [JOBS])
        store.append(message(b"two"), [JOBS, ("staging", "jobs")])
        reopened = yield self.restarted(store)
        self.assertIsNot(reopened, store)
        self.assertEqual(
            sorted((type(r).__name__, r.vhost) for r in reopened.topology()),
            [("BindingRecord", "/"), ("ExchangeRecord", "/"), ("QueueRecord", "/"), ("QueueRecord", "staging")],
        )
        self.assertEqual(self.recovered_bodies(reopened, JOBS), [b"one", b"two"])
        self.assertEqual(self.recovered_bodies(reopened, ("staging", "jobs")), [b"two"])
        self.assertEqual(reopened.stats()["queues"], 2)

    @defer.inlineCallbacks
    def test_each_queue_keeps_its_order_across_restarts(self):
        store = yield self.opened_durable()
        queues = [("/", "q%d" % n) for n in range(3)]
        for queue in queues:
            store.save_queue(queue_record(queue[1]))
        expected = {queue: [] for queue in queues}
        for number in range(60):
            targets = queues if number % 7 == 0 else [queues[number % 3]]
            store.append(message(b"m%d" % number), targets)
            for queue in targets:
                expected[queue].append(b"m%d" % number)
        store = yield self.restarted(store)
        for queue in queues:
            store.append(message(b"after %s" % queue[1].encode()), [queue])
            expected[queue].append(b"after %s" % queue[1].encode())
        store = yield self.restarted(store)
        for queue in queues:
            self.assertEqual(self.recovered_bodies(store, queue), expected[queue])

    @defer.inlineCallbacks
    def test_acks_survive_restarts_including_acks_of_recovered_messages(self):
        store = yield self.opened_durable()
        store.save_queue(queue_record("jobs"))
        handles = [store.append(message(b"m%d" % n), [JOBS]) for n in range(8)]
        store.ack(JOBS, handles[0])
        store = yield self.restarted(store)
        recovered = list(store.recover(JOBS))
        for handle, record, _ in recovered:
            if record.body in (b"m3", b"m7"):
                store.ack(JOBS, handle)
        store = yield self.restarted(store)
        self.assertEqual(self.recovered_bodies(store, JOBS), [b"m1", b"m2", b"m4", b"m5", b"m6"])
        self.assertEqual(store.stats()["messages"], 5)

    @defer.inlineCallbacks
    def test_a_purge_of_recovered_messages_survives_a_restart(self):
        store = yield self.opened_durable()
        store.save_queue(queue_record("jobs"))
        for number in range(5):
            store.append(message(b"m%d" % number), [JOBS])
        store = yield self.restarted(store)
        store.purge(JOBS, [handle for handle, _, _ in store.recover(JOBS)])
        store.append(message(b"after the purge"), [JOBS])
        store = yield self.restarted(store)
        self.assertEqual(self.recovered_bodies(store, JOBS), [b"after the purge"])

    @defer.inlineCallbacks
    def test_a_deleted_queue_stays_deleted_with_its_messages(self):
        store = yield self.opened_durable()
        store.save_exchange(exchange_record("events"))
        store.save_queue(queue_record("jobs"))
        store.save_binding(binding_record("events", "jobs", "#"))
        store.append(message(b"old"), [JOBS])
        store = yield self.restarted(store)
        store.delete_queue(JOBS)
        store = yield self.restarted(store)
        self.assertEqual([type(r).__name__ for r in store.topology()], ["ExchangeRecord"])
        self.assertEqual(self.recovered_bodies(store, JOBS), [])
        store.save_queue(queue_record("jobs"))
        store = yield self.restarted(store)
        self.assertEqual(self.recovered_bodies(store, JOBS), [], "a queue declared again starts empty")
        store.append(message(b"new"), [JOBS])
        store = yield self.restarted(store)
        self.assertEqual(self.recovered_bodies(store, JOBS), [b"new"])

    @defer.inlineCallbacks
    def test_a_message_acked_in_one_of_its_queues_survives_in_the_other(self):
        store = yield self.opened_durable()
        store.save_queue(queue_record("jobs"))
        store.save_queue(queue_record("audit"))
        handles = [store.append(message(b"m%d" % n), [JOBS, AUDIT]) for n in range(4)]
        for handle in handles:
            store.ack(JOBS, handle)
        store.ack(AUDIT, handles[1])
        store = yield self.restarted(store)
        store = yield self.restarted(store)
        self.assertEqual(self.recovered_bodies(store, JOBS), [])
        self.assertEqual(self.recovered_bodies(store, AUDIT), [b"m0", b"m2", b"m3"])
        for handle, _, _ in store.recover(AUDIT):
            record = yield store.read(handle)
            self.assertIn(record.body, (b"m0", b"m2", b"m3"))

    @defer.inlineCallbacks
    def test_delivery_counts_survive_restarts_per_queue_and_go_with_acks(self):
        store = yield self.opened_durable()
        store.save_queue(queue_record("jobs"))
        store.save_queue(queue_record("audit"))
        handles = [store.append(message(b"m%d" % n), [JOBS, AUDIT]) for n in range(5)]
        store.returned(JOBS, handles[1], 1)
        store.returned(JOBS, handles[1], 2)
        store.returned(AUDIT, handles[1], 7)
        store.returned(JOBS, handles[3], 1)
        store.returned(JOBS, handles[4], 1)
        store.ack(JOBS, handles[4])
        store = yield self.restarted(store)
        self.assertEqual(self.counts_by_body(store, JOBS), {b"m1": 2, b"m3": 1}, "the latest count wins")
        self.assertEqual(self.counts_by_body(store, AUDIT), {b"m1": 7}, "each queue counts its own returns")
        for handle, record, _ in store.recover(JOBS):
            if record.body == b"m0":
                store.returned(JOBS, handle, 1)
            if record.body == b"m3":
                store.ack(JOBS, handle)
        store = yield self.restarted(store, crash=True)
        self.assertEqual(self.counts_by_body(store, JOBS), {b"m0": 1, b"m1": 2})
        store = yield self.restarted(store)
        self.assertEqual(self.counts_by_body(store, JOBS), {b"m0": 1, b"m1": 2})
        self.assertEqual(self.counts_by_body(store, AUDIT), {b"m1": 7})

    def counts_by_body(self, store, queue):
        counts = store.delivery_counts(queue)
        return {record.body: counts[handle] for handle, record, _ in store.recover(queue) if handle in counts}

    @defer.inlineCallbacks
    def test_recovered_messages_are_flagged_as_possibly_delivered(self):
        store = yield self.opened_durable()
        store.save_queue(queue_record("jobs"))
        store.append(message(b"m0"), [JOBS])
        store.append(message(b"m1"), [JOBS])
        store = yield self.restarted(store)
        self.assertEqual([redelivered for _, _, redelivered in store.recover(JOBS)], [True, True])

    @defer.inlineCallbacks
    def test_recovered_and_new_messages_read_back_by_their_handles(self):
        store = yield self.opened_durable()
        store.save_queue(queue_record("jobs"))
        store.append(message(b"before"), [JOBS])
        store = yield self.restarted(store)
        (recovered_handle, _, _), = store.recover(JOBS)
        new_handle = store.append(message(b"after"), [JOBS])
        self.assertNotEqual(new_handle, recovered_handle)
        yield store.sync()
        records = yield defer.gatherResults([store.read(recovered_handle), store.read(new_handle)])
        self.assertEqual([record.body for record in records], [b"before", b"after"])

    @defer.inlineCallbacks
    def test_close_keeps_what_was_written_without_a_sync(self):
        store = yield self.opened_durable()
        store.save_queue(queue_record("jobs"))
        store.append(message(b"unsynced"), [JOBS])
        reopened = yield self.reopen(store)
        self.addCleanup(lambda: self._close_quietly(reopened))
        self.assertEqual(self.recovered_bodies(reopened, JOBS), [b"unsynced"])

    @defer.inlineCallbacks
    def test_sync_fires_only_once_another_store_can_read_the_data(self):
        store = yield self.opened_durable()
        store.save_queue(queue_record("jobs"))
        handles = [store.append(message(b"m%d" % n), [JOBS]) for n in range(3)]
        store.ack(JOBS, handles[0])
        yield store.sync()
        beside = yield self.reopen_after_crash(store)
        self.addCleanup(lambda: self._close_quietly(beside))
        self.assertEqual([r.name for r in beside.topology()], ["jobs"])
        self.assertEqual(self.recovered_bodies(beside, JOBS), [b"m1", b"m2"])

    @defer.inlineCallbacks
    def test_each_commit_tells_its_start_on_the_reactor_thread(self):
        """A replication stream sends a commit's operations as it starts (ITimedCommits)."""
        store = yield self.opened_durable()
        seen = []
        store.watch_commit_starts(lambda: seen.append(threading.current_thread().name))
        store.save_queue(queue_record("jobs"))
        store.append(message(b"one"), [JOBS])
        started = len(seen)
        yield store.sync()
        self.assertGreater(len(seen), started, "the sync's commit told its start")
        store.append(message(b"two"), [JOBS])
        yield store.sync()
        self.assertGreaterEqual(len(seen), started + 2, "each commit tells its start")
        self.assertEqual(set(seen), {threading.main_thread().name})

    # -- an ack rides on the next commit: once the sync of a later append fired, a crash keeps it

    @defer.inlineCallbacks
    def test_acks_before_a_later_append_are_kept_by_a_crash_once_its_sync_fired(self):
        store = yield self.opened_durable()
        store.save_queue(queue_record("jobs"))
        store.save_queue(queue_record("audit"))
        handles = [store.append(message(b"m%d" % n), [JOBS]) for n in range(6)]
        yield store.sync()
        store.ack(JOBS, handles[1])
        store.ack(JOBS, handles[4])
        store.append(message(b"marker", "audit"), [AUDIT])
        yield store.sync()
        crashed = yield self.reopen_after_crash(store)  # the files as they are the moment the sync fired
        self.addCleanup(lambda: self._close_quietly(crashed))
        self.assertEqual(self.recovered_bodies(crashed, JOBS), [b"m0", b"m2", b"m3", b"m5"])
        self.assertEqual(self.recovered_bodies(crashed, AUDIT), [b"marker"])

    @defer.inlineCallbacks
    def test_an_ack_made_while_its_messages_commit_runs_is_kept_by_the_next_commit(self):
        store = yield self.opened_durable()
        store.save_queue(queue_record("jobs"))
        store.save_queue(queue_record("audit"))
        yield store.sync()
        commits = store.stats()["commits"]
        handles = [store.append(message(b"m%d" % n), [JOBS, AUDIT]) for n in range(4)]
        first = store.sync()
        yield commit_started(store, commits)  # the batch holding the appends is the writer's now
        store.ack(JOBS, handles[0])
        store.ack(AUDIT, handles[0])
        store.ack(JOBS, handles[2])
        store.append(message(b"marker", "audit"), [AUDIT])
        yield defer.gatherResults([first, store.sync()])
        crashed = yield self.reopen_after_crash(store)
        self.addCleanup(lambda: self._close_quietly(crashed))
        self.assertEqual(self.recovered_bodies(crashed, JOBS), [b"m1", b"m3"])
        self.assertEqual(self.recovered_bodies(crashed, AUDIT), [b"m1", b"m2", b"m3", b"marker"])

    @defer.inlineCallbacks
    def test_acks_of_messages_a_crash_brought_back_are_kept_by_the_next_crash(self):
        store = yield self.opened_durable()
        store.save_queue(queue_record("jobs"))
        store.save_queue(queue_record("audit"))
        for number in range(5):
            store.append(message(b"m%d" % number), [JOBS])
        store = yield self.restarted(store, crash=True)
        for handle, record, _ in store.recover(JOBS):
            if record.body in (b"m0", b"m3"):
                store.ack(JOBS, handle)
        store.append(message(b"marker", "audit"), [AUDIT])
        yield store.sync()
        crashed = yield self.reopen_after_crash(store)
        self.addCleanup(lambda: self._close_quietly(crashed))
        self.assertEqual(self.recovered_bodies(crashed, JOBS), [b"m1", b"m2", b"m4"])

    @defer.inlineCallbacks
    def test_a_message_appended_with_serialized_properties_reads_back_as_any_other(self):
        store = yield self.opened_durable()
        store.save_queue(queue_record("jobs"))
        published = message(b"as sent", color="blue")
        published.published_at = 1_760_000_000_123
        # Two encodings after one another read as one message, the later field winning.
        serialized = (published.properties.SerializeToString()
                      + messages_pb2.BasicProperties(priority=3, message_id="later").SerializeToString())
        expected = messages_pb2.BasicProperties()
        expected.CopyFrom(published.properties)
        expected.priority, expected.message_id = 3, "later"
        appended = SerializedPropertiesMessage("amq.direct", "jobs", serialized, b"as sent",
                                               published.published_at)
        handle = store.append(appended, [JOBS])
        found = [(yield store.read(handle))]
        yield store.sync()
        found.append((yield store.read(handle)))
        store = yield self.restarted(store)
        found += [record for _, record, _ in store.recover(JOBS)]
        self.assertEqual([record_fields(record) for record in found],
                         [("amq.direct", "jobs", expected, b"as sent", published.published_at)] * 3)


@defer.inlineCallbacks
def commit_started(store, commits, timeout=10.0):
    """Wait, a reactor turn at a time, until C{store} has begun a commit after its first C{commits}."""
    deadline = reactor.seconds() + timeout
    while store.stats()["commits"] == commits:
        if reactor.seconds() > deadline:
            raise AssertionError(f"{store.name}: no commit began within {timeout} s")
        yield task.deferLater(reactor, 0, lambda: None)
