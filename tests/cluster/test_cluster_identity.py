"""A cluster's id and secret in a real etcd: the first node makes them, every later node reads the
same ones, and what is not an id or a secret is refused with the key named."""

import base64

from twisted.internet import defer, reactor
from twisted.trial import unittest

from brokerd.cluster.errors import MalformedResponse
from brokerd.cluster.etcd import EtcdClient
from brokerd.cluster.identity import SECRET_BYTES, cluster_identity
from brokerd.cluster.view import ClusterKeys
from tests.support.etcd import needs_etcd, start_etcd


@needs_etcd
class ClusterIdentityTests(unittest.TestCase):
    def setUp(self):
        self.etcd = start_etcd(self)
        self.client = EtcdClient(reactor, self.etcd.url, timeout=2.0)
        self.keys = ClusterKeys("c1")

    @defer.inlineCallbacks
    def test_the_first_node_makes_the_identity_and_the_others_read_the_same(self):
        first = yield cluster_identity(self.client, self.keys)
        second = yield cluster_identity(self.client, self.keys)
        self.assertEqual(second, first)
        self.assertRegex(first.cluster_id, "^[0-9a-f]{32}$")
        self.assertEqual(len(first.secret), SECRET_BYTES)
        other = yield cluster_identity(self.client, ClusterKeys("c2"))
        self.assertNotEqual(other.cluster_id, first.cluster_id)
        self.assertNotEqual(other.secret, first.secret)
        self.assertNotIn(base64.b64encode(first.secret).decode(), repr(first), "the secret is not logged")

    @defer.inlineCallbacks
    def check_refused(self, key, value, named):
        yield cluster_identity(self.client, self.keys)
        yield self.client.put(self.keys.root + key, value)
        with self.assertRaises(MalformedResponse) as refused:
            yield cluster_identity(self.client, self.keys)
        self.assertIn(named, str(refused.exception))
        self.assertIn(f"/brokerd/c1/{key.decode()}", str(refused.exception))

    def test_an_id_that_is_not_32_hexadecimal_digits_is_refused(self):
        return self.check_refused(b"id", b"../../etc/passwd", "cluster id")

    def test_a_secret_that_is_not_base64_is_refused(self):
        return self.check_refused(b"secret", b"not base64 at all!", "cluster secret")

    def test_a_short_secret_is_refused(self):
        return self.check_refused(b"secret", base64.b64encode(b"short"), "cluster secret")

    @defer.inlineCallbacks
    def test_a_missing_secret_is_refused(self):
        yield cluster_identity(self.client, self.keys)
        yield self.client.delete(self.keys.root + b"secret")
        with self.assertRaises(MalformedResponse) as refused:
            yield cluster_identity(self.client, self.keys)
        self.assertIn("secret", str(refused.exception))
