"""The TLS details of a connection in RabbitMQ 3.10's words: cipher suites split as Erlang's ssl names their parts,
certificate names written as rabbit_cert_info writes them (RFC 4514, last RDN first, bytes outside printable ASCII
as \\XX), validity times as RabbitMQ formats them; and none for a transport without TLS."""

import pytest
from OpenSSL import crypto
from twisted.internet.testing import StringTransport

from brokerd.wire.tls_details import NO_TLS, asn1_time, cipher_suite, distinguished_name, escaped, tls_details


@pytest.mark.parametrize(("suite", "parts"), [
    ("TLS_AES_256_GCM_SHA384", ("any", "aes_256_gcm", "aead")),
    ("TLS_CHACHA20_POLY1305_SHA256", ("any", "chacha20_poly1305", "aead")),
    ("TLS_AES_128_CCM_8_SHA256", ("any", "aes_128_ccm_8", "aead")),
    ("ECDHE-RSA-AES256-GCM-SHA384", ("ecdhe_rsa", "aes_256_gcm", "aead")),
    ("ECDHE-ECDSA-CHACHA20-POLY1305", ("ecdhe_ecdsa", "chacha20_poly1305", "aead")),
    ("DHE-RSA-AES128-SHA256", ("dhe_rsa", "aes_128_cbc", "sha256")),
    ("ECDHE-RSA-AES128-SHA", ("ecdhe_rsa", "aes_128_cbc", "sha")),
    ("AES128-SHA", ("rsa", "aes_128_cbc", "sha")),
    ("DES-CBC3-SHA", ("rsa", "3des_ede_cbc", "sha")),
])
def test_a_suite_is_split_as_erlangs_ssl_names_it(suite, parts):
    assert cipher_suite(suite) == parts


def test_a_name_is_written_last_rdn_first_with_rabbitmqs_escapes():
    name = crypto.X509().get_subject()
    name.C, name.O, name.CN = "GB", "Ops, Ltd", "zoë"
    assert distinguished_name(name) == "CN=zo\\C3\\AB,O=Ops\\, Ltd,C=GB"
    assert escaped(b" #a+b;c<d>e\"f\\g ") == '\\ #a\\+b\\;c\\<d\\>e\\"f\\\\g\\ '
    assert escaped(b"#tab\there") == "\\#tab\\09here"


def test_times_are_written_as_rabbitmq_writes_them():
    assert asn1_time(b"20240102030405Z") == "2024-01-02T03:04:05Z"


def test_a_transport_without_tls_has_none():
    assert tls_details(StringTransport()) == NO_TLS
