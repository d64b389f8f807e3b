"""The etcd client against a real etcd: keys, transactions, leases, and endpoints that do not
answer."""

from twisted.internet import defer, reactor
from twisted.trial import unittest

from brokerd.cluster import etcd
from brokerd.cluster.errors import EtcdRefused, EtcdUnavailable, LeaseNotFound
from tests.support.etcd import EtcdProcess, eventually, free_port, needs_etcd


@needs_etcd
class KeyTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.etcd = EtcdProcess().start()

    @classmethod
    def tearDownClass(cls):
        cls.etcd.stop()

    def setUp(self):
        self.client = etcd.EtcdClient(reactor, self.etcd.url)
        self.key = f"/test/{self.id().rpartition('.')[2]}/".encode()

    @defer.inlineCallbacks
    def test_put_range_delete_round_trip_bytes_and_revisions(self):
        value = bytes(range(256))
        revision = yield self.client.put(self.key + b"a", value)
        found = yield self.client.range(self.key + b"a")
        self.assertEqual([(kv.key, kv.value, kv.mod_revision, kv.version) for kv in found.kvs],
                         [(self.key + b"a", value, revision, 1)])
        self.assertGreaterEqual(found.revision, revision)
        deleted = yield self.client.delete(self.key + b"a")
        self.assertEqual(deleted, 1)
        found = yield self.client.range(self.key + b"a")
        self.assertEqual(found.kvs, [])

    @defer.inlineCallbacks
    def test_prefix_reads_and_deletes_only_the_keys_under_it(self):
        for name in (b"x", b"y", b"z"):
            yield self.client.put(self.key + b"p/" + name, name)
        yield self.client.put(self.key + b"q", b"outside")
        found = yield self.client.range(self.key + b"p/", prefix=True)
        self.assertEqual([kv.value for kv in found.kvs], [b"x", b"y", b"z"])
        deleted = yield self.client.delete(self.key + b"p/", prefix=True)
        self.assertEqual(deleted, 3)
        left = yield self.client.range(self.key, prefix=True)
        self.assertEqual([kv.key for kv in left.kvs], [self.key + b"q"])

    @defer.inlineCallbacks
    def test_create_if_absent_refuses_a_second_creator_and_shows_the_first(self):
        key = self.key + b"leader"
        first = yield self.client.txn([etcd.key_absent(key)], [etcd.put_request(key, b"one")],
                                      [etcd.range_request(key)])
        second = yield self.client.txn([etcd.key_absent(key)], [etcd.put_request(key, b"two")],
                                       [etcd.range_request(key)])
        self.assertTrue(first.succeeded)
        self.assertFalse(second.succeeded)
        self.assertEqual([kv.value for kv in second.responses[0].kvs], [b"one"])
        found = yield self.client.range(key)
        self.assertEqual(found.kvs[0].value, b"one")

    @defer.inlineCallbacks
    def test_guarded_updates_compare_value_and_mod_revision(self):
        key = self.key + b"isr"
        revision = yield self.client.put(key, b"[]")
        stale = yield self.client.txn([etcd.mod_revision_is(key, revision - 1)], [etcd.put_request(key, b"no")])
        self.assertFalse(stale.succeeded)
        fresh = yield self.client.txn([etcd.mod_revision_is(key, revision), etcd.value_is(key, b"[]")],
                                      [etcd.put_request(key, b'["a"]'), etcd.delete_request(self.key + b"none")])
        self.assertTrue(fresh.succeeded)
        self.assertEqual(fresh.responses[1], 0)
        wrong_value = yield self.client.txn([etcd.value_is(key, b"[]")], [etcd.put_request(key, b"no")])
        self.assertFalse(wrong_value.succeeded)
        absent = yield self.client.txn([etcd.mod_revision_is(self.key + b"never", 0)], [])
        self.assertTrue(absent.succeeded)
        found = yield self.client.range(key)
        self.assertEqual(found.kvs[0].value, b'["a"]')

    @defer.inlineCallbacks
    def test_a_key_under_a_lease_goes_when_the_lease_expires(self):
        lease = yield self.client.lease_grant(2)
        self.assertEqual(lease.ttl, 2)
        yield self.client.put(self.key + b"member", b"n1", lease=lease.id)
        found = yield self.client.range(self.key + b"member")
        self.assertEqual(found.kvs[0].lease, lease.id)
        left = yield self.client.lease_time_to_live(lease.id)
        self.assertIn(left, (1, 2))
        # etcd expires leases on its own schedule: look until the key is gone, within TTL + 3 s.
        yield eventually(lambda: self.client.range(self.key + b"member"), lambda found: found.kvs == [], timeout=5.0)
        with self.assertRaises(LeaseNotFound):
            yield self.client.lease_keepalive(lease.id)
        with self.assertRaises(LeaseNotFound):
            yield self.client.lease_time_to_live(lease.id)

    @defer.inlineCallbacks
    def test_keepalive_renews_and_revoke_deletes_the_leased_keys(self):
        lease = yield self.client.lease_grant(5)
        yield self.client.put(self.key + b"k", b"v", lease=lease.id)
        ttl = yield self.client.lease_keepalive(lease.id)
        self.assertEqual(ttl, 5)
        yield self.client.lease_revoke(lease.id)
        found = yield self.client.range(self.key + b"k")
        self.assertEqual(found.kvs, [])
        with self.assertRaises(LeaseNotFound):
            yield self.client.lease_revoke(lease.id)

    @defer.inlineCallbacks
    def test_a_put_under_an_unknown_lease_is_refused_with_etcds_reason(self):
        with self.assertRaises(LeaseNotFound) as raised:
            yield self.client.put(self.key + b"k", b"v", lease=12345)
        self.assertIn("lease not found", str(raised.exception))

    @defer.inlineCallbacks
    def test_a_refusal_names_the_endpoint_and_etcds_message(self):
        with self.assertRaises(EtcdRefused) as raised:
            yield self.client.put(b"", b"v")
        self.assertIn(self.etcd.url, str(raised.exception))
        self.assertIn("key is not provided", str(raised.exception))
        self.assertNotEqual(raised.exception.code, 0)

    @defer.inlineCallbacks
    def test_a_dead_endpoint_is_passed_over_for_the_next(self):
        dead = f"http://127.0.0.1:{free_port()}"
        client = etcd.EtcdClient(reactor, f"{dead},{self.etcd.url}")
        yield client.put(self.key + b"k", b"v")
        found = yield client.range(self.key + b"k")
        self.assertEqual(found.kvs[0].value, b"v")


class UnreachableTests(unittest.TestCase):
    @defer.inlineCallbacks
    def test_no_endpoint_answering_is_one_error_naming_every_url(self):
        urls = [f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"]
        client = etcd.EtcdClient(reactor, ",".join(urls), timeout=2.0)
        with self.assertRaises(EtcdUnavailable) as raised:
            yield client.range(b"/k")
        message = str(raised.exception)
        self.assertTrue(message.startswith("no etcd endpoint answered"), message)
        for url in urls:
            self.assertIn(url, message)
        self.assertIn("refused", message)

    def test_plain_http_off_loopback_and_urls_that_are_not_endpoints_are_refused(self):
        for url, why in [("http://10.1.2.3:2379", "plain HTTP off loopback"), ("ftp://127.0.0.1", "not an http"),
                         ("http://127.0.0.1:2379/v3", "more than scheme"), ("", "no etcd endpoint"),
                         ("http://127.0.0.1:99999", "invalid port")]:
            with self.assertRaises(ValueError) as raised:
                etcd.EtcdClient(reactor, url)
            self.assertIn(why, str(raised.exception))
        self.assertEqual(etcd.EtcdClient(reactor, "https://etcd.example:2379, http://[::1]").gateway.urls,
                         [b"https://etcd.example:2379", b"http://[::1]:2379"])


class PrefixEndTests(unittest.SynchronousTestCase):
    def test_the_end_of_a_prefix_is_the_next_key_after_all_of_it(self):
        self.assertEqual(etcd.prefix_end(b"/a/"), b"/a0")
        self.assertEqual(etcd.prefix_end(b"a\xff\xff"), b"b")
        self.assertEqual(etcd.prefix_end(b"\xff"), b"\0")
