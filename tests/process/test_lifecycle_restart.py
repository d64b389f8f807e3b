"""What of a queue's lifecycle outlives a restart, per durable backend: delayed
messages (those due during the downtime fire at the first tick, later ones at
their time), priorities, and TTLs (counted from publishing, not from the restart).

Each test runs a broker on a fake clock over a real store in a temporary
directory, closes the store, and recovers a second broker on a clock set
later, as a broker restarted after some downtime would be.
"""

import shutil
import tempfile

from twisted.internet import defer, reactor, task
from twisted.trial import unittest

from brokerd.model import delayeddelivery
from brokerd.model.broker import Broker
from brokerd.proto.tables import dict_to_table
from brokerd.storage import registry
from brokerd.storage.durability import SyncPolicy
from tests.support.broker import open_channel, properties

START = 1_000_000.0  # seconds since the epoch on the first broker's clock


class LifecycleRestart:
    backend = None

    def setUp(self):
        self.data_dir = tempfile.mkdtemp(prefix=f"brokerd-restart-{self.backend}-")
        self.addCleanup(shutil.rmtree, self.data_dir, True)

    @defer.inlineCallbacks
    def started(self, at):
        """A recovered broker over the store in the data directory, its clock at C{at}: (broker, clock, channel)."""
        store = registry.make_store(self.backend, self.data_dir, SyncPolicy(), reactor=reactor)
        yield store.open()
        self.addCleanup(lambda: store.close())
        clock = task.Clock()
        clock.advance(at)
        broker = Broker(store, clock)
        self.addCleanup(broker.stop)
        broker.recover()
        channel, _ = open_channel(broker)
        return broker, clock, channel

    @defer.inlineCallbacks
    def stopped(self, broker):
        broker.stop()
        yield broker.store.sync()
        yield broker.store.close()

    @staticmethod
    def drain(channel, queue):
        bodies = []
        while (result := channel.basic_get(queue, no_ack=True)) is not None:
            bodies.append(result[2].body)
        return bodies

    @defer.inlineCallbacks
    def test_delayed_messages_due_during_the_downtime_fire_at_start_and_later_ones_on_time(self):
        broker, _, channel = yield self.started(START)
        channel.exchange_declare("later", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
        channel.queue_declare("due", durable=True)
        channel.queue_bind("due", "later", "k")
        for body, delay in ((b"during-downtime", 5_000), (b"after-restart", 60_000), (b"also-during", 10_000)):
            props = properties(persistent=True)
            dict_to_table({"x-delay": delay}, props.headers)
            channel.basic_publish("later", "k", props, body)
        yield self.stopped(broker)
        broker, clock, channel = yield self.started(START + 30)  # down for 30 s
        yield broker.store.sync()
        clock.advance(delayeddelivery.TICK_SECONDS)
        yield broker.store.sync()
        clock.advance(delayeddelivery.TICK_SECONDS)
        self.assertEqual(self.drain(channel, "due"), [b"during-downtime", b"also-during"])
        clock.pump([1.0] * 29)
        self.assertEqual(self.drain(channel, "due"), [])
        clock.pump([0.5] * 4)
        self.assertEqual(self.drain(channel, "due"), [b"after-restart"])
        yield broker.store.sync()
        self.assertEqual(broker.store.stats()["delayed"], 0)
        yield self.stopped(broker)
        broker, clock, channel = yield self.started(START + 200)
        clock.pump([delayeddelivery.TICK_SECONDS] * 5)
        self.assertEqual(self.drain(channel, "due"), [], "what fired and was consumed does not fire again")

    @defer.inlineCallbacks
    def test_priorities_survive(self):
        broker, _, channel = yield self.started(START)
        channel.queue_declare("ranked", durable=True, arguments={"x-max-priority": 9})
        for body, priority in ((b"low", 1), (b"high", 9), (b"middle", 5), (b"high-2", 9), (b"none", None)):
            props = properties(persistent=True) if priority is None else properties(persistent=True, priority=priority)
            channel.basic_publish("", "ranked", props, body)
        yield self.stopped(broker)
        broker, _, channel = yield self.started(START + 1)
        self.assertEqual(self.drain(channel, "ranked"), [b"high", b"high-2", b"middle", b"low", b"none"])

    @defer.inlineCallbacks
    def test_ttls_count_from_publishing_across_a_restart(self):
        broker, _, channel = yield self.started(START)
        channel.queue_declare("short-lived", durable=True, arguments={"x-message-ttl": 10_000})
        channel.queue_declare("own-ttl", durable=True)
        channel.basic_publish("", "short-lived", properties(persistent=True), b"queue-ttl")
        channel.basic_publish("", "own-ttl", properties(persistent=True, expiration="10000"), b"own-ttl")
        channel.basic_publish("", "own-ttl", properties(persistent=True), b"no-ttl")
        yield self.stopped(broker)
        broker, clock, channel = yield self.started(START + 6)
        queues = broker.vhost("/").queues
        self.assertEqual((queues["short-lived"].message_count, queues["own-ttl"].message_count), (1, 2))
        clock.advance(4.5)  # 10.5 s after publishing, 4.5 s after the restart
        self.assertEqual(queues["short-lived"].message_count, 0)
        self.assertEqual(self.drain(channel, "own-ttl"), [b"no-ttl"])

    @defer.inlineCallbacks
    def test_delivery_counts_and_the_delivery_limit_hold_across_restarts(self):
        broker, _, channel = yield self.started(START)
        channel.queue_declare("graveyard", durable=True)
        channel.queue_declare("work", durable=True, arguments={
            "x-delivery-limit": 3, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "graveyard"})
        for body in (b"poison", b"healthy", b"untouched"):
            channel.basic_publish("", "work", properties(persistent=True), body)

        def take_and_return(channel, count):
            """basic.get the head and nack it back C{count} times; the x-delivery-count each delivery showed."""
            seen = []
            for _ in range(count):
                tag, _, message, _ = channel.basic_get("work")
                seen.append((message.body, message.headers.get("x-delivery-count")))
                channel.basic_nack(tag, requeue=True)
            return seen

        self.assertEqual(take_and_return(channel, 2), [(b"poison", None), (b"poison", 1)])
        tag, _, message, _ = channel.basic_get("work")
        channel.basic_nack(tag, requeue=True)  # poison back for the 3rd time
        yield self.stopped(broker)

        broker, _, channel = yield self.started(START + 1)
        tag, _, message, _ = channel.basic_get("work")
        self.assertEqual((message.body, message.headers.get("x-delivery-count")), (b"poison", 3))
        channel.basic_reject(tag, requeue=True)  # the 4th return passes the limit of 3
        self.assertEqual(self.drain(channel, "graveyard"), [b"poison"])
        tag, _, message, _ = channel.basic_get("work")
        channel.basic_nack(tag, requeue=True)
        yield self.stopped(broker)

        broker, _, channel = yield self.started(START + 2)
        self.assertEqual(take_and_return(channel, 1), [(b"healthy", 1)])
        tag, _, message, _ = channel.basic_get("work")
        self.assertEqual((message.body, message.headers.get("x-delivery-count")), (b"healthy", 2))
        channel.basic_ack(tag)
        tag, _, message, _ = channel.basic_get("work")
        self.assertEqual((message.body, message.headers.get("x-delivery-count")), (b"untouched", None))


class SqliteLifecycleRestartTests(LifecycleRestart, unittest.TestCase):
    backend = "sqlite"


class FilelogLifecycleRestartTests(LifecycleRestart, unittest.TestCase):
    backend = "filelog"


class ChunkedLifecycleRestartTests(LifecycleRestart, unittest.TestCase):
    backend = "chunked"
