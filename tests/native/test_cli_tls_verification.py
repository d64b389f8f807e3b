"""The native command line over TLS sends its login only to the broker it named.

One broker serves the native protocol over TLS with a certificate for ``broker.test`` from a test CA. The
command line, trusting that CA, is pointed at the same port once as ``broker.test`` (it works) and once as
``other.test`` (a server holding another name's certificate from the same CA: it must refuse before its hello,
so the broker never sees the user's login). Twisted's ``ssl:`` client form, which checks no name, is refused
unless ``--insecure-skip-verify`` is given, and then it connects with a warning line.
"""

import pytest
import trustme

from brokerd.native.client import UnverifiedTLS, connect
from brokerd.testing import BrokerProcess, native_cli

pytestmark = pytest.mark.long_module(seconds=10)  # started early (tests/conftest.py)

USERS = ("alice", "bob", "carol", "dave", "erin", "frank")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The broker's key and certificate (for broker.test), its users file, and a directory holding only the CA."""
    ca = trustme.CA()
    directory = tmp_path_factory.mktemp("tls-names")
    server = ca.issue_cert("broker.test")
    server.private_key_pem.write_to_path(str(directory / "key.pem"))
    server.cert_chain_pems[0].write_to_path(str(directory / "cert.pem"))
    (directory / "authorities").mkdir()
    ca.cert_pem.write_to_path(str(directory / "authorities" / "ca.pem"))
    (directory / "users").write_text("".join(f"{name}:{name}-secret\n" for name in USERS))
    return directory


@pytest.fixture(scope="module")
def broker(files):
    native = f"ssl:0:interface=127.0.0.1:privateKey={files / 'key.pem'}:certKey={files / 'cert.pem'}"
    process = BrokerProcess(["--backend=memory", "--data-dir", str(files / "data"), "--users", str(files / "users"),
                             "--native", native], cwd=files)
    process.wait_address("native protocol over TLS")
    yield process
    process.stop()


def verified(broker, files, name):
    """A tls: endpoint that expects the broker to be C{name}, reaching it at 127.0.0.1."""
    _, port = broker.wait_address("native protocol over TLS")
    return f"tls:{name}:{port}:trustRoots={files / 'authorities'}:endpoint=tcp\\:127.0.0.1\\:{port}"


def as_user(name):
    return ["--user", name, "--password", f"{name}-secret"]


def test_the_right_name_from_the_trusted_ca_connects(broker, files):
    declared = native_cli(verified(broker, files, "broker.test"), *as_user("bob"), "declare", "queue", "names.ok")
    assert (declared.returncode, declared.stderr) == (0, b"")
    assert declared.stdout.startswith(b"names.ok\t")
    broker.wait_for_output(r"accepted native connection .*user 'bob'")


def test_a_certificate_for_another_name_is_refused_before_the_login_is_sent(broker, files):
    refused = native_cli(verified(broker, files, "other.test"), *as_user("alice"), "declare", "queue", "names.no")
    endpoint = verified(broker, files, "other.test")
    assert (refused.returncode, refused.stderr.decode()) == (
        1, f"error: cannot connect to {endpoint}: the server's certificate is not for other.test"
           " (the login was not sent)\n")
    # The broker answers connections in order: once a later client's login is logged, alice's hello would have
    # been too, had it been sent.
    native_cli(verified(broker, files, "broker.test"), *as_user("carol"), "declare", "queue", "names.later")
    broker.wait_for_output(r"accepted native connection .*user 'carol'")
    assert not [line for line in broker.output if "alice" in line]


def test_a_broker_whose_certificate_comes_from_an_authority_not_trusted_is_refused(broker, files, tmp_path):
    (tmp_path / "authorities").mkdir()
    trustme.CA().cert_pem.write_to_path(str(tmp_path / "authorities" / "other-ca.pem"))
    _, port = broker.wait_address("native protocol over TLS")
    endpoint = f"tls:broker.test:{port}:trustRoots={tmp_path / 'authorities'}:endpoint=tcp\\:127.0.0.1\\:{port}"
    refused = native_cli(endpoint, *as_user("erin"), "declare", "queue", "names.ca")
    assert (refused.returncode, refused.stderr.decode()) == (
        1, f"error: cannot connect to {endpoint}: the TLS handshake failed: certificate verify failed"
           " (the login was not sent)\n")
    native_cli(verified(broker, files, "broker.test"), *as_user("dave"), "declare", "queue", "names.later")
    broker.wait_for_output(r"accepted native connection .*user 'dave'")
    assert not [line for line in broker.output if "erin" in line]


def test_the_ssl_form_is_refused_with_a_line_naming_the_problem(broker, files):
    _, port = broker.wait_address("native protocol over TLS")
    endpoint = f"ssl:host=127.0.0.1:port={port}:caCertsDir={files / 'authorities'}"
    refused = native_cli(endpoint, *as_user("alice"), "declare", "queue", "names.ssl")
    assert refused.returncode == 1
    assert refused.stderr == (
        f"error: --connect: {endpoint!r} does not check the broker's name (Twisted's ssl: client endpoint checks"
        " no host name, and nothing at all without caCertsDir), so any server on the way would be sent the"
        " password; use tls:HOST:PORT:trustRoots=CA_DIR, which checks both, or accept the risk with"
        " --insecure-skip-verify\n"
    ).encode()


def test_the_ssl_form_with_the_opt_out_connects_with_a_warning(broker, files):
    _, port = broker.wait_address("native protocol over TLS")
    endpoint = f"ssl:host=127.0.0.1:port={port}"  # checks nothing: the certificate is for broker.test
    taken = native_cli(endpoint, "--insecure-skip-verify", *as_user("frank"), "declare", "queue", "names.skip")
    assert taken.returncode == 0, taken.stderr
    assert taken.stderr == (
        f"warning: --insecure-skip-verify: connecting with {endpoint!r} without checking the broker's name:"
        " whoever answers at that address receives the password\n"
    ).encode()
    assert taken.stdout.startswith(b"names.skip\t")
    broker.wait_for_output(r"accepted native connection .*user 'frank'")  # the login went to a broker.test certificate


def test_the_client_library_refuses_the_ssl_form_unless_told():
    from twisted.internet import reactor

    failed = []
    connect(reactor, "ssl:host=127.0.0.1:port=1").addErrback(failed.append)
    assert len(failed) == 1 and failed[0].check(UnverifiedTLS)
    assert "--insecure-skip-verify" in str(failed[0].value)
