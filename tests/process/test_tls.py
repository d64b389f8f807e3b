"""TLS listeners through real clients: pika, aio-pika and the native command line, client certificates, EXTERNAL.

One broker serves AMQP over TLS with client certificates required (caCerts=) and EXTERNAL enabled, and the
native protocol over TLS without client certificates, where its clients log in with a password; one more,
started by its test, serves the native protocol with client certificates and EXTERNAL. The certificates are
made here with trustme.
"""

import asyncio
import subprocess

import pika
import pytest
import trustme

from brokerd.testing import BrokerProcess, native_cli, twistd_command
from tests.support.tls import ca, client_context, files  # noqa: F401 (ca, files: fixtures)

pytestmark = pytest.mark.long_module(seconds=15)  # started early (tests/conftest.py)


@pytest.fixture(scope="module")
def broker(files):
    native = f"ssl:0:interface=127.0.0.1:privateKey={files / 'key.pem'}:certKey={files / 'cert.pem'}"
    amqps = f"{native}:caCerts={files / 'ca.pem'}"
    process = BrokerProcess(["--backend=memory", "--amqp", "tcp:0:interface=127.0.0.1", "--amqps", amqps,
                             "--native", native, "--auth-mechanisms", "PLAIN,AMQPLAIN,EXTERNAL"], cwd=files)
    yield process
    process.stop()


def pika_parameters(broker, context, **options):
    host, port = broker.wait_address("AMQP over TLS")
    return pika.ConnectionParameters(host, port, ssl_options=pika.SSLOptions(context, "127.0.0.1"),
                                     connection_attempts=1, **options)


def run_brokerd(cwd, *args):
    """A twistd brokerd that should not start, run to its end."""
    command = [*twistd_command(), "-n", "--pidfile=", "brokerd", "--backend=memory", "--prometheus=none", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60)


def external(broker, ca, common_name):
    """Connection parameters logging in with EXTERNAL and a certificate for C{common_name}."""
    return pika_parameters(broker, client_context(ca, common_name), credentials=pika.credentials.ExternalCredentials())


def test_the_start_up_log_names_the_tls_listeners(broker):
    broker.wait_listening("AMQP over TLS")
    broker.wait_listening("native protocol over TLS")
    assert any("AMQP over TLS listening on 127.0.0.1:" in line and "(--amqps=ssl:" in line for line in broker.output)


def test_pika_over_tls_with_a_client_certificate_round_trips_a_message(broker, ca):
    connection = pika.BlockingConnection(pika_parameters(broker, client_context(ca, "client")))
    try:
        channel = connection.channel()
        channel.queue_declare("tls.pika")
        channel.basic_publish("", "tls.pika", b"over TLS")
        method, _, body = channel.basic_get("tls.pika", auto_ack=True)
        assert body == b"over TLS"
    finally:
        connection.close()


def test_a_client_without_a_certificate_is_refused_at_the_handshake(broker, ca):
    with pytest.raises(pika.exceptions.AMQPConnectionError) as refused:
        pika.BlockingConnection(pika_parameters(broker, client_context(ca)))
    assert "CERTIFICATE_REQUIRED" in str(refused.value)  # the TLS alert, before any AMQP


def test_a_certificate_from_another_authority_is_refused(broker, ca):
    context = client_context(ca)
    trustme.CA().issue_cert("intruder", common_name="guest").configure_cert(context)
    with pytest.raises(pika.exceptions.AMQPConnectionError) as refused:
        pika.BlockingConnection(pika_parameters(broker, context))
    assert "UNKNOWN_CA" in str(refused.value)


def test_aio_pika_over_tls(broker, ca):
    import aio_pika

    host, port = broker.wait_address("AMQP over TLS")

    async def round_trip():
        connection = await aio_pika.connect(f"amqps://guest:guest@{host}:{port}/",
                                            ssl_context=client_context(ca, "client"))
        async with connection:
            channel = await connection.channel()
            queue = await channel.declare_queue("tls.aio", auto_delete=True)
            await channel.default_exchange.publish(aio_pika.Message(b"aio over TLS"), routing_key="tls.aio")
            message = await queue.get(timeout=5)
            await message.ack()
            return message.body

    assert asyncio.run(round_trip()) == b"aio over TLS"


def test_external_logs_in_the_user_the_certificate_names(broker, ca):
    connection = pika.BlockingConnection(external(broker, ca, "guest"))
    try:
        assert connection.is_open
        connection.channel().queue_declare("tls.external")
    finally:
        connection.close()


def test_external_refuses_a_user_that_does_not_exist_with_403(broker, ca):
    with pytest.raises(pika.exceptions.AMQPConnectionError) as refused:
        pika.BlockingConnection(external(broker, ca, "mallory"))
    reply = "(403) \"ACCESS_REFUSED - EXTERNAL login refused: user 'mallory' - invalid credentials\""
    assert reply in str(refused.value)


def test_external_is_not_offered_on_the_plain_listener(broker):
    host, port = broker.wait_address("AMQP")
    parameters = pika.ConnectionParameters(host, port, credentials=pika.credentials.ExternalCredentials(),
                                           connection_attempts=1)
    with pytest.raises(pika.exceptions.AuthenticationError, match="^EXTERNAL$"):
        pika.BlockingConnection(parameters)  # pika found EXTERNAL missing from connection.start's mechanisms
    plain = pika.BlockingConnection(pika.ConnectionParameters(host, port, connection_attempts=1))
    plain.close()


def test_the_native_command_line_over_tls(broker, files):
    _, port = broker.wait_address("native protocol over TLS")
    endpoint = f"tls:127.0.0.1:{port}:trustRoots={files / 'authorities'}"
    declared = native_cli(endpoint, "declare", "queue", "tls.native")
    assert declared.returncode == 0, declared.stderr
    assert native_cli(endpoint, "publish", "--routing-key", "tls.native", "--confirm", "native TLS").returncode == 0
    consumed = native_cli(endpoint, "consume", "tls.native", "--count", "1")
    assert consumed.stdout == b"native TLS\n", consumed.stderr


def test_the_native_login_over_tls_is_checked(broker, files):
    _, port = broker.wait_address("native protocol over TLS")
    endpoint = f"tls:127.0.0.1:{port}:trustRoots={files / 'authorities'}"
    refused = native_cli(endpoint, "--user", "guest", "--password", "wrong", "get", "tls.native")
    assert (refused.returncode, refused.stderr) == (
        1, b"error: 403 ACCESS_REFUSED - PLAIN login refused: user 'guest' - invalid credentials\n")


def test_native_external_logs_in_the_user_the_certificate_names(tmp_path, files, ca):
    """A native listener with caCerts and EXTERNAL enabled: the certificate's CN is the user, or 403."""
    native = (f"ssl:0:interface=127.0.0.1:privateKey={files / 'key.pem'}:certKey={files / 'cert.pem'}"
              f":caCerts={files / 'ca.pem'}")
    process = BrokerProcess(["--backend=memory", "--data-dir", str(tmp_path / "data"), "--native", native,
                             "--auth-mechanisms", "PLAIN,EXTERNAL"], cwd=tmp_path)
    try:
        _, port = process.wait_address("native protocol over TLS")
        results = {}
        for name in ("guest", "mallory"):
            ca.issue_cert(name, common_name=name).private_key_and_cert_chain_pem.write_to_path(str(tmp_path / name))
            endpoint = (f"tls:127.0.0.1:{port}:trustRoots={files / 'authorities'}"
                        f":certificate={tmp_path / name}:privateKey={tmp_path / name}")
            results[name] = native_cli(endpoint, "--external", "--user", "nobody", "declare", "queue", "tls.external")
    finally:
        process.stop()
    assert (results["guest"].returncode, results["guest"].stderr) == (0, b"")
    assert (results["mallory"].returncode, results["mallory"].stderr) == (
        1, b"error: 403 ACCESS_REFUSED - EXTERNAL login refused: user 'mallory' - invalid credentials\n")


@pytest.mark.parametrize("parameter", ["privateKey", "certKey", "caCerts"])
def test_a_missing_key_or_certificate_file_is_one_line_naming_the_option(tmp_path, files, parameter):
    given = {"privateKey": files / "key.pem", "certKey": files / "cert.pem", "caCerts": files / "ca.pem"}
    given[parameter] = "missing.pem"
    endpoint = "ssl:0:" + ":".join(f"{name}={path}" for name, path in given.items())
    finished = run_brokerd(tmp_path, "--amqps", endpoint)
    assert finished.returncode != 0
    assert finished.stderr.strip() == (
        f"twistd brokerd: --amqps: cannot read {parameter} 'missing.pem': No such file or directory")
    assert "Traceback" not in finished.stdout + finished.stderr


def test_a_file_that_is_not_pem_is_one_line_naming_the_option(tmp_path, files):
    (tmp_path / "junk.pem").write_text("not a key\n")
    endpoint = f"ssl:0:privateKey=junk.pem:certKey={files / 'cert.pem'}"
    finished = run_brokerd(tmp_path, "--amqps", endpoint)
    assert finished.returncode != 0
    assert finished.stderr.strip() == (
        "twistd brokerd: --amqps: privateKey 'junk.pem' is not a PEM file of the right kind")


def test_external_is_neither_offered_nor_accepted_without_a_client_certificate():
    from twisted.internet.testing import StringTransport

    from brokerd.amqp import auth

    plain = StringTransport()
    enabled = auth.Authenticator(mechanisms=auth.ALL_MECHANISMS)
    assert enabled.offered_mechanisms(plain) == ("PLAIN", "AMQPLAIN")
    refused = []
    enabled.login("EXTERNAL", b"", "127.0.0.1", plain).addErrback(refused.append)
    assert str(refused[0].value) == "EXTERNAL login refused: connection has no peer certificate"
    disabled = auth.Authenticator()
    refused = []
    disabled.login("EXTERNAL", b"", "127.0.0.1", plain).addErrback(refused.append)
    assert str(refused[0].value) == "unsupported authentication mechanism 'EXTERNAL'; use one of PLAIN, AMQPLAIN"


@pytest.mark.parametrize(("args", "complaint"), [
    (["--amqps", "tcp:5671"],
     "twistd brokerd: --amqps: 'tcp:5671' is not a TLS endpoint; use ssl:PORT:privateKey=..."),
    (["--auth-mechanisms", "PLAIN,KERBEROS"],
     "twistd brokerd: --auth-mechanisms: 'PLAIN,KERBEROS' must name some of PLAIN, AMQPLAIN, EXTERNAL"),
])
def test_tls_options_that_cannot_work_are_one_line(tmp_path, args, complaint):
    from brokerd.process.tap import Options

    with pytest.raises(SystemExit) as stopped:
        Options().parseOptions(["--backend=memory", f"--data-dir={tmp_path}", "--native", "none", *args])
    assert str(stopped.value) == complaint
