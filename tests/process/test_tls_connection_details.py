"""/api/connections tells each connection's TLS and login mechanism as RabbitMQ 3.10 does, on a real broker.

A pika connection over TLS with a client certificate is listed with ssl true, the protocol and suite in Erlang's
names (tlsv1.3, any, aes_256_gcm, aead; tlsv1.2 and ecdhe_ecdsa when the client caps TLS at 1.2) and the
certificate's subject, issuer (RFC 4514, last RDN first) and validity; a plain connection with ssl false and every
TLS field null, as RabbitMQ lists one. auth_mechanism is the one the client logged in with: PLAIN (pika), AMQPLAIN
(py-amqp, as kombu logs in with it) or EXTERNAL (pika with a certificate).
"""

import contextlib
import ssl

import amqp
import pika
import pytest
from cryptography import x509

from brokerd.testing import BrokerProcess, poll_until
from tests.support.httpapi import Api, segment
from tests.support.tls import ca, client_context, files  # noqa: F401 (ca, files: fixtures)

WAIT_SECONDS = 10
NO_TLS = {"ssl": False, "ssl_protocol": None, "ssl_key_exchange": None, "ssl_cipher": None, "ssl_hash": None,
          "peer_cert_subject": None, "peer_cert_issuer": None, "peer_cert_validity": None}


@pytest.fixture(scope="module")
def broker(files):
    amqps = (f"ssl:0:interface=127.0.0.1:privateKey={files / 'key.pem'}:certKey={files / 'cert.pem'}"
             f":caCerts={files / 'ca.pem'}")
    process = BrokerProcess(["--backend=memory", "--native", "none", "--amqp", "tcp:0:interface=127.0.0.1",
                             "--amqps", amqps, "--auth-mechanisms", "PLAIN,AMQPLAIN,EXTERNAL"], cwd=files)
    yield process
    assert process.stop() == 0


@pytest.fixture(scope="module")
def api(broker):
    return Api(broker.wait_listening("HTTP API"))


def listed(api, name):
    """The /api/connections entry of the connection named C{name}, once listed."""
    def entry():
        found = [entry for entry in api.get("/api/connections")
                 if entry["client_properties"].get("connection_name") == name]
        return found[0] if found else None
    return poll_until(entry, WAIT_SECONDS, f"/api/connections entry for {name}")


def tls_fields(entry):
    return {key: value for key, value in entry.items() if key == "ssl" or key.startswith(("ssl_", "peer_cert_"))}


def certificate_details(context):
    """The certificate a context of L{client_context} presents, as RabbitMQ lists it: subject, issuer, validity."""
    certificate = x509.load_pem_x509_certificate(context.presented_pem)
    stamp = "%Y-%m-%dT%H:%M:%SZ"
    return {
        "peer_cert_subject": certificate.subject.rfc4514_string(),
        "peer_cert_issuer": certificate.issuer.rfc4514_string(),
        "peer_cert_validity": f"{certificate.not_valid_before_utc.strftime(stamp)}"
                              f" - {certificate.not_valid_after_utc.strftime(stamp)}",
    }


def presenting(ca, common_name, maximum_version=None):
    """A client context presenting a certificate for C{common_name}; its PEM kept as C{presented_pem}."""
    context = client_context(ca)
    issued = ca.issue_cert(common_name, common_name=common_name)
    issued.configure_cert(context)
    context.presented_pem = issued.cert_chain_pems[0].bytes()
    if maximum_version is not None:
        context.maximum_version = maximum_version
    return context


@contextlib.contextmanager
def pika_over_tls(broker, context, name, **options):
    host, port = broker.wait_address("AMQP over TLS")
    connection = pika.BlockingConnection(pika.ConnectionParameters(
        host, port, ssl_options=pika.SSLOptions(context, "127.0.0.1"), connection_attempts=1,
        client_properties={"connection_name": name}, **options))
    try:
        yield connection
    finally:
        connection.close()


def negotiated(connection):
    """(protocol, suite) the client's side of a pika connection negotiated, as Python's ssl names them."""
    sock = connection._impl._transport._sock
    return sock.version(), sock.cipher()[0]


def test_a_tls_connection_is_listed_with_its_protocol_suite_and_certificate(broker, api, ca):
    context = presenting(ca, "tls-client")
    with pika_over_tls(broker, context, "over-tls") as connection:
        assert negotiated(connection) == ("TLSv1.3", "TLS_AES_256_GCM_SHA384")
        entry = listed(api, "over-tls")
    assert tls_fields(entry) == {"ssl": True, "ssl_protocol": "tlsv1.3", "ssl_key_exchange": "any",
                                 "ssl_cipher": "aes_256_gcm", "ssl_hash": "aead",
                                 **certificate_details(context)}
    assert entry["peer_cert_subject"].startswith("CN=tls-client,")
    assert entry["auth_mechanism"] == "PLAIN"


def test_a_tls_1_2_connection_names_its_key_exchange(broker, api, ca):
    context = presenting(ca, "tls12-client", maximum_version=ssl.TLSVersion.TLSv1_2)
    with pika_over_tls(broker, context, "over-tls12") as connection:
        assert negotiated(connection) == ("TLSv1.2", "ECDHE-ECDSA-AES256-GCM-SHA384")  # trustme's keys are ECDSA
        entry = listed(api, "over-tls12")
    assert (entry["ssl_protocol"], entry["ssl_key_exchange"], entry["ssl_cipher"], entry["ssl_hash"]) == (
        "tlsv1.2", "ecdhe_ecdsa", "aes_256_gcm", "aead")


def test_an_external_login_is_listed_as_external(broker, api, ca):
    context = presenting(ca, "guest")
    with pika_over_tls(broker, context, "external", credentials=pika.credentials.ExternalCredentials()):
        entry = listed(api, "external")
    assert (entry["user"], entry["auth_mechanism"], entry["ssl"]) == ("guest", "EXTERNAL", True)
    assert entry["peer_cert_subject"] == certificate_details(context)["peer_cert_subject"]


def test_a_plain_connection_has_no_tls_details_and_names_its_mechanism(broker, api):
    host, port = broker.wait_address("AMQP")
    with contextlib.closing(pika.BlockingConnection(pika.ConnectionParameters(
            host, port, client_properties={"connection_name": "plain-pika"}, connection_attempts=1))):
        entry = listed(api, "plain-pika")
        alone = api.get(f"/api/connections/{segment(entry['name'])}")
    assert tls_fields(entry) == NO_TLS  # RabbitMQ 3.10.8 lists a plain connection so,
    assert tls_fields(alone) == {key: "" if value is None else value for key, value in NO_TLS.items()}  # "" alone
    assert entry["auth_mechanism"] == alone["auth_mechanism"] == "PLAIN"
    client = amqp.Connection(f"{host}:{port}", userid="guest", password="guest", login_method="AMQPLAIN",
                             client_properties={"connection_name": "amqplain"}, connect_timeout=10)
    client.connect()
    try:
        entry = listed(api, "amqplain")
    finally:
        client.close()
    assert (entry["auth_mechanism"], entry["ssl"]) == ("AMQPLAIN", False)
