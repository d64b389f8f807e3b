"""What the filelog store does with damaged files: a torn tail is cut off, damage
in the middle makes only its queue unrecoverable, foreign and orphaned files are
left alone, and a damaged topology file stops the store from opening."""

import os

from twisted.internet import defer
from twisted.trial import unittest

from brokerd.errors import NotFound
from brokerd.interfaces import StoreCorrupted
from brokerd.proto import messages_pb2
from tests.support.broker import make_broker, open_channel
from tests.support.filelog_files import RECORD_LENGTH, FilelogStores, record_spans
from tests.support.logs import LogWatcher
from tests.support.store_contract import AUDIT, JOBS, binding_record, exchange_record, message, queue_record


class FilelogDamageTests(FilelogStores, unittest.TestCase):
    @defer.inlineCallbacks
    def closed_store_with(self, bodies, queues=(JOBS,)):
        """A closed store whose queues each hold C{bodies}."""
        store = yield self.open_store()
        for queue in queues:
            store.save_queue(queue_record(queue[1], vhost=queue[0]))
        for body in bodies:
            store.append(message(body), list(queues))
        yield store.close()
        return store

    @defer.inlineCallbacks
    def test_a_truncated_last_record_is_cut_off_and_logged(self):
        store = yield self.closed_store_with([b"m0", b"m1", b"m2"])
        path = self.queue_path(store, JOBS)
        spans = record_spans(path)
        os.truncate(path, os.path.getsize(path) - 3)
        logged = LogWatcher(self)
        store = yield self.reopen(store)
        self.assertEqual([r.body for _, r, _ in store.recover(JOBS)], [b"m0", b"m1"])
        self.assertEqual(os.path.getsize(path), spans[2][0])
        dropped = spans[2][1] - 3
        self.assertEqual(len(logged.matching(path, "torn tail of %d bytes" % dropped)), 1)
        store.append(message(b"m3"), [JOBS])
        store = yield self.reopen(store)
        self.assertEqual([r.body for _, r, _ in store.recover(JOBS)], [b"m0", b"m1", b"m3"])

    @defer.inlineCallbacks
    def test_a_last_record_damaged_before_the_part_checked_at_open_is_still_cut_off(self):
        # Open checks the CRCs of the records near the end only; the last one is checked whatever its size.
        big = b"b" * (200 << 10)
        store = yield self.closed_store_with([b"m%d" % n for n in range(300)] + [big])
        path = self.queue_path(store, JOBS)
        offset, size = record_spans(path)[-1]
        with open(path, "r+b") as queue_file:
            queue_file.seek(offset + 100)
            queue_file.write(b"c")
        logged = LogWatcher(self)
        store = yield self.reopen(store)
        self.assertEqual([r.body for _, r, _ in store.recover(JOBS)], [b"m%d" % n for n in range(300)])
        self.assertEqual(os.path.getsize(path), offset)
        self.assertEqual(len(logged.matching(path, "torn tail of %d bytes" % size, "CRC")), 1)

    @defer.inlineCallbacks
    def test_garbage_after_the_last_record_is_cut_off_and_logged(self):
        crafted = RECORD_LENGTH.pack(6) + b"\x08\x01abcd" + b"\0\0\0\0"  # well framed, wrong CRC
        for garbage in (b"garbage that is no record", crafted, b"\0" * 4096, crafted + b"and more"):
            store = yield self.closed_store_with([b"m0", b"m1"])
            path = self.queue_path(store, JOBS)
            size = os.path.getsize(path)
            with open(path, "ab") as queue_file:
                queue_file.write(garbage)
            logged = LogWatcher(self)
            store = yield self.reopen(store)
            self.assertEqual([r.body for _, r, _ in store.recover(JOBS)], [b"m0", b"m1"])
            self.assertEqual(os.path.getsize(path), size)
            self.assertEqual(len(logged.matching(path, "torn tail of %d bytes" % len(garbage))), 1)

    @defer.inlineCallbacks
    def test_a_damaged_record_in_the_middle_makes_its_queue_unrecoverable(self):
        for damaged_byte in ("body", "length"):
            store = yield self.closed_store_with([b"m0", b"m1", b"m2"], queues=(JOBS, AUDIT))
            path = self.queue_path(store, JOBS)
            offset, size = record_spans(path)[1]
            flip_at = offset + size - 6 if damaged_byte == "body" else offset + 1
            with open(path, "r+b") as queue_file:
                queue_file.seek(flip_at)
                original = queue_file.read(1)
                queue_file.seek(flip_at)
                queue_file.write(bytes([original[0] ^ 0x40]))
            contents = open(path, "rb").read()
            store = yield self.reopen(store)
            with self.assertRaises(StoreCorrupted) as raised:
                store.recover(JOBS)
            self.assertEqual((raised.exception.path, raised.exception.offset), (path, offset))
            self.assertIn(path, str(raised.exception))
            self.assertIn("offset %d" % offset, str(raised.exception))
            self.assertEqual([r.body for _, r, _ in store.recover(AUDIT)], [b"m0", b"m1", b"m2"])
            self.assertRaises(StoreCorrupted, store.append, message(b"refused"), [AUDIT, JOBS])
            store.append(message(b"m3"), [AUDIT])
            yield store.sync()
            self.assertEqual(open(path, "rb").read(), contents, "a damaged file is left as it was")

    @defer.inlineCallbacks
    def test_a_broker_serves_the_other_queues_of_a_store_with_a_damaged_one(self):
        store = yield self.closed_store_with([b"m0", b"m1", b"m2"], queues=(JOBS, AUDIT))
        path = self.queue_path(store, JOBS)
        offset, _ = record_spans(path)[1]
        with open(path, "r+b") as queue_file:
            queue_file.seek(offset + 9)
            queue_file.write(b"\xff")
        store = yield self.reopen(store)
        broker, _ = make_broker(store)
        self.assertEqual(broker.recover()["unavailable"], 1)
        channel, _ = open_channel(broker)
        with self.assertRaises(NotFound) as raised:
            channel.basic_get("jobs")
        self.assertIn("unavailable", str(raised.exception))
        self.assertEqual([channel.basic_get("audit")[2].body for _ in range(3)], [b"m0", b"m1", b"m2"])
        channel.queue_delete("jobs")  # drops the damaged file with the queue
        channel.queue_declare("jobs", durable=True)
        channel.basic_publish("", "jobs", message(b"fresh").properties, b"fresh")
        store = yield self.reopen(store)
        self.assertEqual([r.body for _, r, _ in store.recover(JOBS)], [b"fresh"])

    @defer.inlineCallbacks
    def test_an_empty_or_missing_queue_file_means_an_empty_queue(self):
        store = yield self.closed_store_with([b"m0"], queues=(JOBS, AUDIT))
        open(self.queue_path(store, JOBS), "wb").close()
        os.unlink(self.queue_path(store, AUDIT))
        store = yield self.reopen(store)
        self.assertEqual((list(store.recover(JOBS)), list(store.recover(AUDIT))), ([], []))
        self.assertEqual(len([r for r in store.topology() if isinstance(r, messages_pb2.QueueRecord)]), 2)
        store.append(message(b"next"), [JOBS, AUDIT])
        store = yield self.reopen(store)
        self.assertEqual([r.body for _, r, _ in store.recover(AUDIT)], [b"next"])

    @defer.inlineCallbacks
    def test_a_file_cut_short_inside_its_header_is_emptied_and_logged(self):
        store = yield self.closed_store_with([b"m0"])
        path = self.queue_path(store, JOBS)
        os.truncate(path, 10)
        logged = LogWatcher(self)
        store = yield self.reopen(store)
        self.assertEqual(list(store.recover(JOBS)), [])
        self.assertEqual(os.path.getsize(path), 0)
        self.assertEqual(len(logged.matching(path, "torn header of 10 bytes")), 1)
        store.append(message(b"m1"), [JOBS])
        store = yield self.reopen(store)
        self.assertEqual([r.body for _, r, _ in store.recover(JOBS)], [b"m1"])

    @defer.inlineCallbacks
    def test_a_file_holding_another_queue_makes_its_queue_unrecoverable(self):
        store = yield self.closed_store_with([b"for audit"], queues=(AUDIT,))
        store = yield self.reopen(store)
        store.save_queue(queue_record("jobs"))
        store = yield self.reopen(store)
        yield store.close()
        os.replace(self.queue_path(store, AUDIT), self.queue_path(store, JOBS))
        store = yield self.reopen(store)
        with self.assertRaises(StoreCorrupted) as raised:
            store.recover(JOBS)
        self.assertIn("does not start with the header of ('/', 'jobs')", str(raised.exception))
        self.assertEqual(list(store.recover(AUDIT)), [])

    @defer.inlineCallbacks
    def test_a_queue_file_the_topology_does_not_hold_is_ignored_and_never_revived(self):
        store = yield self.closed_store_with([b"old", b"older"], queues=(JOBS,))
        path = self.queue_path(store, JOBS)
        orphan = open(path, "rb").read()
        store = yield self.reopen(store)
        store.delete_queue(JOBS)
        store = yield self.reopen(store)
        with open(path, "wb") as queue_file:  # as if the crash came between topology and removal
            queue_file.write(orphan)
        logged = LogWatcher(self)
        store = yield self.reopen(store)
        self.assertEqual(len(logged.matching(path, "no queue of the topology")), 1)
        self.assertEqual(list(store.topology()), [])
        store.save_queue(queue_record("jobs"))
        store.append(message(b"new"), [JOBS])
        store = yield self.reopen(store)
        self.assertEqual([r.body for _, r, _ in store.recover(JOBS)], [b"new"])

    @defer.inlineCallbacks
    def test_a_damaged_topology_file_stops_the_store_from_opening(self):
        for damage in (b"not a topology", b""):
            store = yield self.open_store()
            store.save_exchange(exchange_record("events"))
            store.save_queue(queue_record("jobs"))
            store.save_binding(binding_record("events", "jobs", "#"))
            yield store.close()
            path = os.path.join(store.directory, "topology")
            with open(path, "r+b") as topology_file:
                if damage:
                    topology_file.seek(30)
                    topology_file.write(damage)
                else:
                    topology_file.truncate(40)
            again = self.make_store(self.data_dir_of(store))
            failure = yield self.assertFailure(again.open(), StoreCorrupted)
            self.assertIn(path, str(failure))
            self.assertEqual(failure.path, path)
            yield again.close()
