"""etcd over TLS: the client checks the certificate chain against the CA file it is given and the host
name against the certificate, and refuses a server that fails either."""

import shutil
import tempfile

import trustme
from twisted.internet import defer, reactor
from twisted.trial import unittest

from brokerd.cluster.errors import EtcdUnavailable
from brokerd.cluster.etcd import EtcdClient
from tests.support.broker import wait_until
from tests.support.etcd import EtcdProcess, connections_to, needs_etcd


@needs_etcd
class TLSTests(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.directory = tempfile.mkdtemp(prefix="brokerd-etcd-tls-")
        ca = trustme.CA()
        server = ca.issue_cert("localhost")  # not 127.0.0.1: a URL naming the address fails the name check
        cls.ca_file = f"{cls.directory}/ca.pem"
        ca.cert_pem.write_to_path(cls.ca_file)
        trustme.CA().cert_pem.write_to_path(f"{cls.directory}/other-ca.pem")
        server.private_key_pem.write_to_path(f"{cls.directory}/key.pem")
        server.private_key_and_cert_chain_pem.write_to_path(f"{cls.directory}/chain.pem")
        cls.etcd = EtcdProcess(tls=(f"{cls.directory}/chain.pem", f"{cls.directory}/key.pem", cls.ca_file)).start()
        cls.port = cls.etcd.url.rpartition(":")[2]

    @classmethod
    def tearDownClass(cls):
        cls.etcd.stop()
        shutil.rmtree(cls.directory, ignore_errors=True)

    def tearDown(self):
        return wait_until(lambda: not connections_to(self.etcd.url))

    @defer.inlineCallbacks
    def test_a_server_whose_chain_and_name_check_out_is_used(self):
        client = EtcdClient(reactor, f"https://localhost:{self.port}", ca_file=self.ca_file)
        yield client.put(b"/tls/k", b"v")
        found = yield client.range(b"/tls/k")
        self.assertEqual(found.kvs[0].value, b"v")

    @defer.inlineCallbacks
    def test_a_certificate_from_another_ca_is_refused(self):
        client = EtcdClient(reactor, f"https://localhost:{self.port}", ca_file=f"{self.directory}/other-ca.pem")
        with self.assertRaises(EtcdUnavailable) as raised:
            yield client.range(b"/tls/k")
        self.assertIn("certificate verify failed", str(raised.exception))

    @defer.inlineCallbacks
    def test_without_a_ca_file_the_platforms_trust_store_does_not_know_the_test_ca(self):
        client = EtcdClient(reactor, f"https://localhost:{self.port}")
        with self.assertRaises(EtcdUnavailable) as raised:
            yield client.range(b"/tls/k")
        self.assertIn("certificate verify failed", str(raised.exception))

    @defer.inlineCallbacks
    def test_a_certificate_for_another_name_is_refused(self):
        client = EtcdClient(reactor, f"https://127.0.0.1:{self.port}", ca_file=self.ca_file)
        with self.assertRaises(EtcdUnavailable) as raised:
            yield client.range(b"/tls/k")
        self.assertIn("the TLS check of the server failed", str(raised.exception))
        self.assertIn("IPAddressMismatch", str(raised.exception))

    def test_a_ca_file_that_is_missing_or_holds_no_certificate_is_named(self):
        with open(f"{self.directory}/empty.pem", "w") as empty:
            empty.write("nothing here\n")
        for path, why in [(f"{self.directory}/missing.pem", "No such file"),
                          (f"{self.directory}/empty.pem", "no PEM certificate")]:
            with self.assertRaises(ValueError) as raised:
                EtcdClient(reactor, f"https://localhost:{self.port}", ca_file=path)
            self.assertIn(path, str(raised.exception))
            self.assertIn(why, str(raised.exception))
