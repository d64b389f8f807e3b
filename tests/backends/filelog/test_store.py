"""The store contract for the filelog backend, plus what is particular to it:
its file format, compaction, and commits under each sync policy (damaged files
are in L{tests.backends.filelog.test_damage})."""

import math
import os

from twisted.internet import defer, reactor, task
from twisted.trial import unittest

from backends.common.fileio import DirectoryInUse
from backends.filelog import backend, records
from backends.filelog.queuefile import queue_file_name
from brokerd.model.message import Message
from brokerd.proto import messages_pb2
from brokerd.storage.durability import SyncPolicy
from tests.support.filelog_files import QUEUE_FILE_MAGIC, RECORD_LENGTH, FilelogStores, header_size, record_spans
from tests.support.store_contract import AUDIT, JOBS, StoreContract, message, queue_record
from tests.support.store_contract_durable import DurableStoreContract


class FilelogStoreContractTests(FilelogStores, StoreContract, unittest.TestCase):
    pass


class FilelogDurableStoreContractTests(FilelogStores, DurableStoreContract, unittest.TestCase):
    pass


class FilelogFormatTests(FilelogStores, unittest.TestCase):
    @defer.inlineCallbacks
    def test_each_queue_has_its_own_file_named_safely_after_it(self):
        store = yield self.open_store()
        odd = ("a/b", "../../etc/passwd \u00e9")
        long_named = ("v" * 255, "q" * 255)
        for queue in (JOBS, odd, long_named):
            store.save_queue(queue_record(queue[1], vhost=queue[0]))
            store.append(message(b"for " + queue[1][:5].encode()), [queue])
        yield store.sync()
        names = sorted(name for name in os.listdir(store.directory) if name.endswith(".qlog"))
        self.assertEqual(names, sorted(queue_file_name(queue) for queue in (JOBS, odd, long_named)))
        self.assertTrue(all(len(name) < 255 for name in names))
        store = yield self.reopen(store)
        self.assertEqual([r.body for _, r, _ in store.recover(odd)], [b"for ../.."])
        self.assertEqual(len(list(store.recover(long_named))), 1)

    @defer.inlineCallbacks
    def test_a_file_is_a_header_naming_its_queue_then_length_message_crc_records(self):
        store = yield self.open_store()
        store.save_queue(queue_record("jobs"))
        store.append(message(b"hello"), [JOBS])
        yield store.sync()
        with open(self.queue_path(store, JOBS), "rb") as queue_file:
            data = queue_file.read()
        start = header_size(data)
        self.assertEqual(data[len(QUEUE_FILE_MAGIC) + 4 : start - 4], b"/\0jobs")
        (length,) = RECORD_LENGTH.unpack_from(data, start)
        self.assertEqual(len(data), start + 4 + length + 4)
        self.assertEqual(data[start + 4 : start + 6], b"\x08\x01", "the valid flag is byte 1 of the message")
        record = messages_pb2.StoredMessage.FromString(data[start + 4 : start + 4 + length])
        self.assertEqual((record.valid, record.body), (True, b"hello"))

    def test_a_message_is_encoded_as_protobuf_would_without_copying_its_body(self):
        for size in (0, 1, 127, 128, 20_000, 3_000_000):
            published = message(b"b" * size, colour="red")
            head, body = records.encode(published)
            self.assertIs(body, published.body)
            expected = messages_pb2.StoredMessage(
                valid=True,
                exchange=published.exchange,
                routing_key=published.routing_key,
                properties=published.properties,
                body=published.body,
            )
            self.assertEqual(head + body, expected.SerializeToString())

    @defer.inlineCallbacks
    def test_a_message_for_two_queues_is_written_to_both_files_under_one_handle(self):
        store = yield self.open_store()
        store.save_queue(queue_record("jobs"))
        store.save_queue(queue_record("audit"))
        handle = store.append(message(b"shared"), [JOBS, AUDIT])
        yield store.sync()
        self.assertEqual(len(record_spans(self.queue_path(store, JOBS))), 1)
        self.assertEqual(len(record_spans(self.queue_path(store, AUDIT))), 1)
        store.ack(JOBS, handle)
        yield store.sync()
        record = yield store.read(handle)
        self.assertEqual(record.body, b"shared")

    @defer.inlineCallbacks
    def test_an_ack_flips_the_valid_byte_in_place_and_survives_a_restart(self):
        store = yield self.open_store()
        store.save_queue(queue_record("jobs"))
        handles = [store.append(message(b"m%d" % n), [JOBS]) for n in range(3)]
        yield store.sync()
        path = self.queue_path(store, JOBS)
        size = os.path.getsize(path)
        store.ack(JOBS, handles[1])
        yield store.sync()
        self.assertEqual(os.path.getsize(path), size)
        with open(path, "rb") as queue_file:
            data = queue_file.read()
        self.assertEqual([data[offset + 5] for offset, _ in record_spans(path)], [1, 0, 1])
        store = yield self.reopen(store)
        self.assertEqual([r.body for _, r, _ in store.recover(JOBS)], [b"m0", b"m2"])

    @defer.inlineCallbacks
    def test_reading_after_close_fails(self):
        store = yield self.open_store()
        store.save_queue(queue_record("jobs"))
        handle = store.append(message(b"fresh"), [JOBS])
        yield store.close()
        yield self.assertFailure(store.read(handle), RuntimeError)

    @defer.inlineCallbacks
    def test_an_append_acked_before_its_commit_is_never_written(self):
        store = yield self.open_store()
        store.save_queue(queue_record("jobs"))
        handle = store.append(message(b"gone at once"), [JOBS])
        store.append(message(b"kept"), [JOBS])
        store.ack(JOBS, handle)
        yield store.sync()
        self.assertEqual(len(record_spans(self.queue_path(store, JOBS))), 1)

    @defer.inlineCallbacks
    def test_a_commit_writes_each_file_once_whatever_the_number_of_messages(self):
        store = yield self.open_store()
        store.save_queue(queue_record("jobs"))
        store.save_queue(queue_record("audit"))
        for number in range(500):
            store.append(message(b"m%d" % number), [JOBS, AUDIT])
        yield store.sync()
        stats = store.stats()
        self.assertEqual((stats["file_writes"], stats["fsyncs"]), (2, 1))
        self.assertEqual(len(record_spans(self.queue_path(store, AUDIT))), 500)
        # The topology file and its directory entry, both queue files, the directory for their creation:
        self.assertEqual(stats["file_syncs"], 5)
        store.append(message(b"only jobs"), [JOBS])
        yield store.sync()
        self.assertEqual(store.stats()["file_syncs"], 6, "a commit fsyncs only the files it touched")

    @defer.inlineCallbacks
    def test_big_bodies_are_written_from_where_they_are_in_few_calls(self):
        store = yield self.open_store()
        store.save_queue(queue_record("jobs"))
        bodies = [b"%04d" % number + b"x" * (20 * 1024) for number in range(1500)]
        properties = messages_pb2.BasicProperties(delivery_mode=messages_pb2.PERSISTENT)
        for body in bodies:
            store.append(Message("", "jobs", properties, body), [JOBS])
        yield store.sync()
        # Each body is a buffer of its own, between the joined framing around it;
        # the kernel takes at most IOV_MAX buffers a call.
        self.assertEqual(store.stats()["file_writes"], math.ceil((2 * len(bodies) + 1) / os.sysconf("SC_IOV_MAX")))
        store = yield self.reopen(store)
        self.assertEqual([record.body for _, record, _ in store.recover(JOBS)], bodies)

    @defer.inlineCallbacks
    def test_a_second_store_cannot_open_the_files_of_an_open_one(self):
        store = yield self.open_store()
        second = self.make_store(self.data_dir_of(store))
        failure = yield self.assertFailure(second.open(), DirectoryInUse)
        self.assertIn(store.directory, str(failure))
        yield second.close()
        store = yield self.reopen(store)  # closing released the lock
        self.assertEqual(store.stats()["messages"], 0)

    @defer.inlineCallbacks
    def test_options_are_checked_and_name_themselves(self):
        for options, named in [
            ({"compact_min_records": "0"}, "compact_min_records"),
            ({"compact_min_records": "many"}, "compact_min_records"),
            ({"compact_valid_ratio": "1.5"}, "compact_valid_ratio"),
            ({"colour": "blue"}, "colour"),
        ]:
            with self.assertRaises(ValueError) as raised:
                backend.make_store(self.fresh_data_dir(), SyncPolicy(), reactor=reactor, **options)
            self.assertIn(named, str(raised.exception))
        store = yield self.open_store()
        self.assertEqual((store.compact_min_records, store.compact_valid_ratio), (2000, 0.5))
        self.assertEqual(os.path.basename(store.directory), "filelog")


class FilelogCompactionTests(FilelogStores, unittest.TestCase):
    options = {"compact_min_records": "10", "compact_valid_ratio": "0.5"}

    @defer.inlineCallbacks
    def test_a_file_is_compacted_once_fewer_than_the_ratio_of_its_records_are_valid(self):
        store, handles = yield self.filled(20)
        path = self.queue_path(store, JOBS)
        full_size = os.path.getsize(path)
        for handle in handles[:10]:  # 10 of 20 still valid: not fewer than half
            store.ack(JOBS, handle)
        yield store.sync()
        self.assertEqual((store.stats()["compactions"], os.path.getsize(path)), (0, full_size))
        store.ack(JOBS, handles[10])  # 9 of 20
        yield store.sync()
        self.assertEqual(store.stats()["compactions"], 1)
        self.assertEqual(len(record_spans(path)), 9)
        self.assertLess(os.path.getsize(path), full_size / 2)
        record = yield store.read(handles[15])
        self.assertEqual(record.body, b"m15")

    @defer.inlineCallbacks
    def test_a_file_with_fewer_records_than_the_minimum_is_not_compacted(self):
        store, handles = yield self.filled(9)
        for handle in handles:
            store.ack(JOBS, handle)
        yield store.sync()
        self.assertEqual(store.stats()["compactions"], 0)
        self.assertEqual(len(record_spans(self.queue_path(store, JOBS))), 9)

    @defer.inlineCallbacks
    def test_compaction_keeps_order_and_content_across_restarts_and_later_appends(self):
        store, handles = yield self.filled(30)
        for handle in handles[::3] + handles[1::3]:
            store.ack(JOBS, handle)
        yield store.sync()
        self.assertEqual(store.stats()["compactions"], 1)
        store.append(message(b"after", colour="red"), [JOBS])
        store.ack(JOBS, handles[2])
        store = yield self.reopen(store)
        recovered = [record for _, record, _ in store.recover(JOBS)]
        expected = [b"m%02d" % n for n in range(5, 30, 3)] + [b"after"]
        self.assertEqual([record.body for record in recovered], expected)
        self.assertEqual(recovered[-1].properties.headers.fields[0].name, "colour")
        self.assertEqual(len(record_spans(self.queue_path(store, JOBS))), 11, "10 kept, m02 acked since, 'after'")

    @defer.inlineCallbacks
    def test_a_file_found_mostly_acked_at_open_is_compacted(self):
        store, handles = yield self.filled(20)
        store = yield self.reopen(store, compact_min_records="1000")
        for handle, _, _ in list(store.recover(JOBS))[:15]:
            store.ack(JOBS, handle)
        store = yield self.reopen(store)
        self.assertEqual(store.stats()["compactions"], 1)
        self.assertEqual(len(record_spans(self.queue_path(store, JOBS))), 5)
        self.assertEqual([r.body for _, r, _ in store.recover(JOBS)], [b"m%02d" % n for n in range(15, 20)])


class FilelogSyncPolicyTests(FilelogStores, unittest.TestCase):
    """Many messages committed through GroupCommit under each sync policy all come back."""

    timeout = 60

    @defer.inlineCallbacks
    def publish_and_restart(self, policy, rounds=8, per_round=400):
        self.sync_policy = policy
        store = yield self.open_store()
        store.save_queue(queue_record("jobs"))
        store.save_queue(queue_record("audit"))
        syncs, expected = [], []
        for round_number in range(rounds):
            for number in range(per_round):
                body = b"r%d-m%d" % (round_number, number)
                store.append(message(body), [JOBS, AUDIT] if number % 4 == 0 else [JOBS])
                expected.append(body)
            syncs.append(store.sync())
            yield task.deferLater(reactor, 0, lambda: None)  # let commits overlap with appends
        yield defer.gatherResults(syncs)
        stats = store.stats()
        store = yield self.reopen(store)
        self.assertEqual([r.body for _, r, _ in store.recover(JOBS)], expected)
        self.assertEqual(len(list(store.recover(AUDIT))), rounds * per_round // 4)
        return stats

    @defer.inlineCallbacks
    def test_sync_always_fsyncs_once_per_commit_not_per_message(self):
        stats = yield self.publish_and_restart(SyncPolicy("always"))
        self.assertGreaterEqual(stats["fsyncs"], 1)
        self.assertLessEqual(stats["fsyncs"], stats["commits"])
        self.assertLess(stats["commits"], 3200 // 100)

    @defer.inlineCallbacks
    def test_sync_none_never_fsyncs_message_files(self):
        stats = yield self.publish_and_restart(SyncPolicy("none"))
        self.assertEqual(stats["fsyncs"], 0)
        self.assertEqual(stats["file_syncs"], 1, "only the topology file, before its rename")

    @defer.inlineCallbacks
    def test_sync_interval_commits_on_its_timer(self):
        stats = yield self.publish_and_restart(SyncPolicy("interval", 0.01))
        self.assertGreaterEqual(stats["fsyncs"], 1)
