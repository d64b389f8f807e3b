"""Watching keys in a real etcd: puts and deletes in order, resumption after etcd was killed and
restarted, and a fresh read when etcd compacted the history a resumed watch needed."""

from twisted.internet import defer, reactor
from twisted.internet.protocol import Protocol
from twisted.protocols.portforward import ProxyFactory
from twisted.trial import unittest

from brokerd.cluster import etcd
from brokerd.cluster.watch import KeyWatch
from tests.support.broker import wait_until
from tests.support.etcd import needs_etcd, start_etcd


class Seen:
    """What a watch delivered: snapshots as {key: value}, events as (deleted, key, value, mod_revision)."""

    def __init__(self):
        self.snapshots, self.events = [], []

    def snapshot(self, kvs, revision):
        self.snapshots.append(({kv.key: kv.value for kv in kvs}, revision))

    def changed(self, events):
        self.events.extend((event.deleted, event.kv.key, event.kv.value, event.kv.mod_revision) for event in events)


class CuttableRelay:
    """A TCP relay to etcd on a fixed loopback port, which a test can cut (every connection dropped,
    no new one taken) and mend, or freeze (connections stay open and new ones are taken, but nothing
    passes any more), as network partitions would."""

    def __init__(self, target_url):
        host, _, port = target_url.rpartition("/")[2].partition(":")
        self._factory = ProxyFactory(host, int(port))
        self._protocols = []
        self._frozen = False
        original = self._factory.buildProtocol

        def build(addr):
            proto = Protocol() if self._frozen else original(addr)
            self._protocols.append(proto)
            return proto

        self._factory.buildProtocol = build
        self._port = reactor.listenTCP(0, self._factory, interface="127.0.0.1")
        self.url = f"http://127.0.0.1:{self._port.getHost().port}"

    def freeze(self):
        self._frozen = True
        for proto in self._protocols:
            for side in (proto, getattr(proto, "peer", None)):
                if side is not None and side.transport is not None:
                    side.transport.pauseProducing()

    def cut(self):
        for proto in self._protocols:
            for side in (proto, getattr(proto, "peer", None)):
                if side is not None and side.transport is not None:
                    side.transport.abortConnection()
        self._protocols.clear()
        return self._port.stopListening()

    def mend(self):
        self._port = reactor.listenTCP(int(self.url.rpartition(":")[2]), self._factory, interface="127.0.0.1")

    def close(self):
        self.cut()


@needs_etcd
class WatchTests(unittest.TestCase):
    def setUp(self):
        self.etcd = start_etcd(self)
        self.client = etcd.EtcdClient(reactor, self.etcd.url)
        self.seen = Seen()

    def watch(self, key, client=None, prefix=True, probe_seconds=5.0):
        watch = KeyWatch(client or self.client, reactor, key, self.seen.snapshot, self.seen.changed, prefix=prefix,
                         retry_seconds=0.1, probe_seconds=probe_seconds)
        self.addCleanup(watch.stop)
        return watch

    @defer.inlineCallbacks
    def test_a_watch_reads_the_keys_then_sees_puts_and_deletes_in_order(self):
        yield self.client.put(b"/c/before", b"0")
        yield self.client.put(b"/other", b"x")
        watch = self.watch(b"/c/")
        yield watch.start()
        self.assertEqual(self.seen.snapshots[0][0], {b"/c/before": b"0"})
        first = yield self.client.put(b"/c/a", b"1")
        yield self.client.put(b"/other", b"y")
        yield self.client.put(b"/c/a", b"2")
        last = yield self.client.delete(b"/c/before")
        self.assertEqual(last, 1)
        yield wait_until(lambda: len(self.seen.events) == 3)
        self.assertEqual([event[:3] for event in self.seen.events],
                         [(False, b"/c/a", b"1"), (False, b"/c/a", b"2"), (True, b"/c/before", b"")])
        self.assertEqual(self.seen.events[0][3], first)
        self.assertEqual(watch.revision, self.seen.events[-1][3])

    @defer.inlineCallbacks
    def test_a_watch_resumes_after_etcd_is_killed_and_restarted_without_losing_or_repeating(self):
        watch = self.watch(b"/r/")
        yield watch.start()
        yield self.client.put(b"/r/1", b"one")
        yield wait_until(lambda: len(self.seen.events) == 1)
        self.etcd.kill()
        self.etcd.restart()
        yield self.client.put(b"/r/2", b"two")
        yield self.client.delete(b"/r/1")
        yield wait_until(lambda: len(self.seen.events) == 3, timeout=10)
        self.assertEqual([event[:3] for event in self.seen.events],
                         [(False, b"/r/1", b"one"), (False, b"/r/2", b"two"), (True, b"/r/1", b"")])
        self.assertEqual(len(self.seen.snapshots), 1)

    @defer.inlineCallbacks
    def test_a_watch_cut_off_while_history_was_compacted_reads_the_keys_again(self):
        relay = CuttableRelay(self.etcd.url)
        self.addCleanup(relay.close)
        watch = self.watch(b"/k/", client=etcd.EtcdClient(reactor, relay.url))
        yield watch.start()
        yield self.client.put(b"/k/a", b"1")
        yield wait_until(lambda: len(self.seen.events) == 1)
        yield relay.cut()
        yield self.client.put(b"/k/b", b"2")
        yield self.client.delete(b"/k/a")
        revision = yield self.client.put(b"/unrelated", b"3")
        yield self.client.call(b"/v3/kv/compaction", {"revision": str(revision)})
        relay.mend()
        yield wait_until(lambda: len(self.seen.snapshots) == 2, timeout=10)
        self.assertEqual(self.seen.snapshots[1][0], {b"/k/b": b"2"})
        self.assertEqual(watch.snapshots, 2)
        yield self.client.put(b"/k/c", b"4")
        yield wait_until(lambda: len(self.seen.events) == 2)
        self.assertEqual(self.seen.events[1][:3], (False, b"/k/c", b"4"))

    @defer.inlineCallbacks
    def test_a_watch_on_an_endpoint_gone_silent_moves_to_the_next_and_resumes(self):
        relay = CuttableRelay(self.etcd.url)
        self.addCleanup(relay.close)
        client = etcd.EtcdClient(reactor, f"{relay.url},{self.etcd.url}", timeout=1.0)
        watch = self.watch(b"/p/", client=client, probe_seconds=0.5)
        yield watch.start()
        yield self.client.put(b"/p/1", b"one")
        yield wait_until(lambda: len(self.seen.events) == 1)
        yield wait_until(lambda: watch.probes_answered >= 1)  # a live endpoint answers the probe
        self.assertEqual(watch.probes_failed, 0)
        relay.freeze()  # the stream stays open and says nothing, as a partitioned endpoint's would
        yield self.client.put(b"/p/2", b"two")
        yield wait_until(lambda: len(self.seen.events) == 2, timeout=10)
        self.assertEqual([event[:3] for event in self.seen.events],
                         [(False, b"/p/1", b"one"), (False, b"/p/2", b"two")])
        self.assertGreaterEqual(watch.probes_failed, 1)
        self.assertEqual(watch.snapshots, 1)

    @defer.inlineCallbacks
    def test_a_single_key_watch_ignores_keys_that_only_share_its_prefix(self):
        watch = self.watch(b"/s/leader", prefix=False)
        yield watch.start()
        yield self.client.put(b"/s/leader2", b"no")
        yield self.client.put(b"/s/leader", b"yes")
        yield wait_until(lambda: len(self.seen.events) == 1)
        self.assertEqual(self.seen.events[0][:3], (False, b"/s/leader", b"yes"))


