"""brokerd-admin over https checks the broker's certificate and name before it sends the credentials.

A broker serves its management API over TLS (``--http ssl:...``) with a certificate for ``localhost`` only, from
a test CA. brokerd-admin trusting that CA (``--ssl-ca-cert-file``) works at ``https://localhost:PORT``, and is
refused at ``https://127.0.0.1:PORT`` (a server holding another name's certificate from the same CA) and by a
client that trusts only the system's authorities, in one line, with the broker never asked anything.
"""

import pytest
import trustme

from brokerd.testing import BrokerProcess
from tests.support.admin_cli import admin

pytestmark = pytest.mark.long_module(seconds=8)  # started early (tests/conftest.py)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    ca = trustme.CA()
    directory = tmp_path_factory.mktemp("https")
    server = ca.issue_cert("localhost")
    server.private_key_pem.write_to_path(str(directory / "key.pem"))
    server.cert_chain_pems[0].write_to_path(str(directory / "cert.pem"))
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    return directory


@pytest.fixture(scope="module")
def port(files):
    http = f"ssl:0:interface=127.0.0.1:privateKey={files / 'key.pem'}:certKey={files / 'cert.pem'}"
    process = BrokerProcess(["--backend=memory", "--native", "none", "--http", http, "--http-access-log"],
                            cwd=files)
    try:
        yield process.wait_address("HTTP API over TLS")[1], process
    finally:
        process.stop()


def test_the_right_name_from_the_trusted_ca_works(port, files):
    number, _ = port
    status, out, err = admin(f"https://localhost:{number}", "--ssl-ca-cert-file", str(files / "ca.pem"),
                             "list", "vhosts")
    assert (status, err) == (0, "")
    assert "/" in out.split()


def test_a_certificate_for_another_name_is_refused_in_one_line(port, files):
    number, broker = port
    status, out, err = admin(f"https://127.0.0.1:{number}", "--ssl-ca-cert-file", str(files / "ca.pem"),
                             "list", "users")
    assert (status, out) == (1, "")
    assert err.startswith(f"error: could not reach the broker's management API at https://127.0.0.1:{number}:"
                          " [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: IP address mismatch"), err
    assert err.count("\n") == 1
    # Requests are logged (--http-access-log) in the order they come: once a later one is, the refused one
    # would have been too, had it been sent.
    admin(f"https://localhost:{number}", "--ssl-ca-cert-file", str(files / "ca.pem"), "list", "policies")
    broker.wait_for_output(r'"GET /api/policies')
    assert not [line for line in broker.output if '"GET /api/users' in line]


def test_a_certificate_from_an_authority_not_trusted_is_refused(port):
    number, _ = port
    status, out, err = admin(f"https://localhost:{number}", "list", "vhosts")
    assert (status, out) == (1, "")
    assert "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: unable to get local issuer" in err, err


def test_an_unreadable_ca_file_is_one_line(port, tmp_path):
    number, _ = port
    missing = tmp_path / "missing.pem"
    status, out, err = admin(f"https://localhost:{number}", "--ssl-ca-cert-file", str(missing), "list", "vhosts")
    assert (status, out, err) == (
        1, "", f"error: --ssl-ca-cert-file: cannot read {str(missing)!r}: No such file or directory\n")
