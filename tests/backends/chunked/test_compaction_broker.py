"""Compaction of sparse chunks in the chunked store seen from above: random
work on several queues with restarts and crashes against a model of each
queue, a real Broker whose parked queue's chunks are compacted while it
holds their handles, and the compaction benchmark."""

import json
import os
import random
import subprocess
import sys

from twisted.internet import defer
from twisted.trial import unittest

from tests.support.broker import make_broker, open_channel, properties
from tests.support.chunked_compaction import COUNT, PARKED, Compacting, parked_numbers, published, settle
from tests.support.chunked_files import DATA, chunk_numbers, record_bytes, sized
from tests.support.paths import ROOT
from tests.support.store_contract import JOBS, queue_record


class RandomTests(Compacting, unittest.TestCase):
    @defer.inlineCallbacks
    def test_random_work_with_restarts_and_crashes_keeps_every_queue_as_a_model_says(self):
        chooser = random.Random(1919)
        queues = [JOBS, PARKED, ("/", "slow")]
        store = yield self.open_store(compact_below="50", compact_bytes="2K")
        for vhost, name in queues:
            store.save_queue(queue_record(name, vhost=vhost))
        held = {queue: [] for queue in queues}  # queue -> [(handle, number)] in order
        counts = {queue: {} for queue in queues}  # queue -> {handle: delivery count}
        bodies, compacted = {}, 0
        for round_number in range(40):
            for _ in range(chooser.randint(5, 30)):
                number = len(bodies)
                bodies[number] = sized("r%05d" % number, chooser.randint(20, 1500))
                targets = [queue for queue in queues if chooser.random() < 0.5] or [JOBS]
                handle = store.append(bodies[number], targets)
                for queue in targets:
                    held[queue].append((handle, number))
            for queue, share in ((JOBS, 0.9), (PARKED, 0.02), (("/", "slow"), 0.2)):
                for entry in [entry for entry in held[queue] if chooser.random() < share]:
                    store.ack(queue, entry[0])
                    held[queue].remove(entry)
                    counts[queue].pop(entry[0], None)
                for handle, _ in held[queue][:2]:
                    counts[queue][handle] = counts[queue].get(handle, 0) + 1
                    store.returned(queue, handle, counts[queue][handle])
            yield settle(store)
            for queue in queues:
                self.assertEqual([store.load(handle).body for handle, _ in held[queue]],
                                 [bodies[number].body for _, number in held[queue]], round_number)
            if round_number % 10 == 9:
                compacted += store.stats()["compacted_chunks"]
                store = yield (self.reopen(store) if round_number % 20 == 9 else self.reopen_after_crash(store))
                for queue in queues:
                    self.assertEqual(list(store.recovered_handles(queue)), [handle for handle, _ in held[queue]])
                    self.assertEqual(store.delivery_counts(queue), counts[queue])
        self.assertGreater(compacted, 5)
        self.assertLessEqual(store.stats()["chunks"], 2 + 2 * sum(
            record_bytes(bodies[number]) for queue in queues for _, number in held[queue]) // DATA + 2)


def delivery_count(message):
    """A delivered message's x-delivery-count header, or None."""
    for field in message.properties.headers.fields:
        if field.name == "x-delivery-count":
            return field.value.integer_value
    return None


class BrokerTests(Compacting, unittest.TestCase):
    """A real Broker over the store: what a client of a parked queue sees while and after its chunks are compacted."""

    @defer.inlineCallbacks
    def restarted(self, store):
        """The store reopened and a broker recovered from it: (store, broker, channel)."""
        store = yield self.reopen(store)
        broker, _ = make_broker(store)
        broker.recover()
        return store, broker, open_channel(broker)[0]

    def take(self, channel, queue):
        """basic.get until empty: (tag, number, redelivered, x-delivery-count) of each message, bodies checked."""
        got = []
        while True:
            result = channel.basic_get(queue)
            if result is None:
                return got
            tag, redelivered, message, _ = result
            number = int(message.properties.message_id[1:])
            self.assertEqual(message.body, published(number).body)
            got.append((tag, number, redelivered, delivery_count(message)))

    @defer.inlineCallbacks
    def test_a_parked_queue_is_delivered_in_order_with_its_counts_while_and_after_its_chunks_go(self):
        store = yield self.open_store()
        broker, _ = make_broker(store)
        channel, _ = open_channel(broker)
        for name in ("jobs", "parked"):
            channel.queue_declare(name, durable=True)
        for number in range(COUNT):
            queue = "parked" if number in parked_numbers() else "jobs"
            channel.basic_publish("", queue, properties(True, message_id="p%03d" % number), published(number).body)
        yield store.sync()
        channel.basic_get("parked")
        channel.basic_reject(channel.basic_get("parked")[0], requeue=True)  # the second one comes back
        channel.connection.close_channel(channel.id)  # and so does the first
        yield store.sync()
        chunks = len(chunk_numbers(store))
        # After a restart the broker holds handles only; the chunks go while it holds them.
        store, broker, channel = yield self.restarted(store)
        for tag, _, _, _ in self.take(channel, "jobs"):
            channel.basic_ack(tag)
        yield settle(store)
        self.assertGreaterEqual(chunks, 10)
        self.assertLessEqual(len(chunk_numbers(store)), 2)
        self.assertGreater(store.stats()["moved_messages"], 0)
        parked = parked_numbers()
        got = self.take(channel, "parked")
        self.assertEqual([(number, redelivered, count) for _, number, redelivered, count in got],
                         [(number, True, 1 if number in parked[:2] else None) for number in parked])
        channel.basic_ack(got[0][0])  # acked by the handle it had before it moved
        channel.basic_reject(got[2][0], requeue=True)
        channel.connection.close_channel(channel.id)  # the rest come back unacked
        yield store.sync()
        store, broker, channel = yield self.restarted(store)
        got = self.take(channel, "parked")
        self.assertEqual([(number, count) for _, number, _, count in got],
                         [(number, 2 if number == parked[1] else 1) for number in parked[1:]])
        self.assertEqual(self.take(channel, "jobs"), [])


def test_the_compaction_benchmark_shows_disk_use_following_what_is_held():
    root = ROOT
    output = subprocess.run(
        [sys.executable, "-m", "benchmarks.chunked_compaction", "--messages", "3000", "--chunk-size", "64K",
         "--batch", "200", "--compact-after", "0", "--compare", "--json"],
        cwd=root, env={**os.environ, "PYTHONPATH": root}, capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    without, with_compaction = (json.loads(line) for line in output.splitlines())
    assert (without["compact_below"], with_compaction["compact_below"]) == (0, 25)
    assert without["held_body_bytes"] == with_compaction["held_body_bytes"] == without["parked_body_bytes"]
    assert without["chunks"] > 20 and without["compacted_chunks"] == 0
    assert with_compaction["chunks"] <= 3 and with_compaction["compacted_chunks"] > 20
    assert with_compaction["bytes_on_disk"] * 10 < without["bytes_on_disk"]
