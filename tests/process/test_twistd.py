"""`twistd brokerd` as users run it: a real subprocess, its options, its plugin."""

import pathlib
import subprocess
import sys

import pytest

import brokerd
from brokerd.testing import BrokerProcess, native_cli, twistd_command
from brokerd.wire.endpoints import tls_installed
from tests.support.fresh_install import install_copy, isolated_environment

pytestmark = pytest.mark.long_module(seconds=40)  # started early (tests/conftest.py)



def twistd(*args, cwd, env=None):
    return subprocess.run(
        [*twistd_command(), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def broker(tmp_path):
    process = BrokerProcess(["--backend=memory", "--native", "tcp:0:interface=127.0.0.1"], cwd=tmp_path)
    yield process
    process.stop()


def test_a_message_round_trips_through_the_command_line(broker):
    endpoint = broker.wait_listening("native protocol")
    declared = native_cli(endpoint, "declare", "queue", "greetings")
    assert declared.returncode == 0, declared.stderr
    assert declared.stdout.startswith(b"greetings\t")
    published = native_cli(
        endpoint, "publish", "--routing-key", "greetings", "--confirm", "--header", "lang=en", "hello, world"
    )
    assert published.returncode == 0, published.stderr
    consumed = native_cli(endpoint, "consume", "greetings", "--count", "1")
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout == b"hello, world\n"
    empty = native_cli(endpoint, "get", "greetings")
    assert empty.returncode == 2
    assert b"is empty" in empty.stderr


def test_command_line_reports_broker_errors(broker):
    endpoint = broker.wait_listening("native protocol")
    refused = native_cli(endpoint, "declare", "queue", "amq.mine")
    assert refused.returncode == 1
    assert b"403 ACCESS_REFUSED" in refused.stderr
    unroutable = native_cli(endpoint, "publish", "--routing-key", "nowhere", "--mandatory", "lost")
    assert unroutable.returncode == 1
    assert b"312 NO_ROUTE" in unroutable.stderr


def test_broker_stops_cleanly_on_sigterm_with_exit_status_0(broker):
    broker.wait_listening("native protocol")
    assert broker.stop() == 0
    assert any("brokerd stopped cleanly" in line for line in broker.output)
    assert any("Server Shut Down" in line for line in broker.output)
    assert not any("Traceback" in line for line in broker.output)


def test_help_documents_every_option_with_its_default(tmp_path):
    result = twistd("brokerd", "--help", cwd=tmp_path)
    assert result.returncode == 0
    for option, default in [
        ("--backend=", "chunked"),
        ("--data-dir=", "./brokerd-data"),
        ("--native=", "tcp:5673:interface=127.0.0.1"),
        ("--native-max-frame=", "134283264"),
        ("--amqp=", "tcp:5672:interface=127.0.0.1"),
        ("--http=", "tcp:15672:interface=127.0.0.1"),
        ("--heartbeat=", "60"),
        ("--frame-max=", "131072"),
        ("--max-message-size=", "134217728"),
        ("--memory-high-watermark=", "1G"),
        ("--connection-memory-share=", "0.25"),
        ("--connection-memory-limit=", "0.5"),
        ("--consumer-timeout=", "1800000"),
        ("--users=", None),
        ("--sync=", "always"),
    ]:
        assert option in result.stdout
        if default is not None:
            assert f"[default: {default}]" in result.stdout.replace("\n", " ").replace("  ", "")


@pytest.mark.parametrize(
    "args, complaint",
    [
        (["--backend=nosuch"], "--backend: unknown backend 'nosuch'; known backends: chunked, filelog, memory, sqlite"),
        (["--backend=memory:size=1"], "--backend: backend 'memory' has no option 'size'"),
        (["--native=bogus:1"], "--native: 'bogus:1' is not a valid endpoint"),
        (["--native-max-frame=lots"], "--native-max-frame: 'lots' is not a size"),
        (["--no-such-option"], "option --no-such-option not recognized"),
        (["--amqp=tcp:notaport"], "--amqp: 'tcp:notaport' is not a valid endpoint"),
        (["--heartbeat=-1"], "--heartbeat: '-1' is not a number of seconds (0-65535)"),
        (["--frame-max=100"], "--frame-max: 100 is outside 4096..4294967295"),
        (["--max-message-size=big"], "--max-message-size: 'big' is not a size"),
        (["--memory-high-watermark=x"], "--memory-high-watermark: 'x' is not a size"),
        (["--connection-memory-share=0.6"],
         "--connection-memory-share: a connection's memory share (644245094 bytes) must be above 0 and below its"
         " limit (536870912 bytes)"),
        (["--connection-memory-limit=half"],
         "--connection-memory-limit: 'half' is neither a fraction of the watermark (e.g. 0.25) nor a size"),
        (["--connection-memory-share=1.5"],
         "--connection-memory-share: '1.5' is not a fraction of the watermark above 0 and at most 1 (e.g. 0.25)"),
        (["--consumer-timeout=soon"],
         "--consumer-timeout: 'soon' is not a number of milliseconds (0 or none: no timeout)"),
        (["--sync=sometimes"], "--sync: unknown sync mode 'sometimes'; use always, interval:MS or none"),
        (["--users=/nonexistent/users"], "--users: cannot read '/nonexistent/users': No such file or directory"),
        (["--backend=chunked:chunk_size=4M", "--max-message-size=16M"],
         "--max-message-size: a message of 16777216 bytes would not fit in the chunked backend's chunks of 4194304"
         " bytes; raise its chunk_size or lower --max-message-size"),
        (["--backend=chunked:chunk_size=1"], "--backend: backend 'chunked': option chunk_size must be at least 4096"),
        (["--native=tcp:99999"], "--native: 'tcp:99999' is not a valid endpoint: port 99999 is outside 0-65535"),
        (["--prometheus=tcp:99999"],
         "--prometheus: 'tcp:99999' is not a valid endpoint: port 99999 is outside 0-65535"),
        (["--http=tcp:notaport"], "--http: 'tcp:notaport' is not a valid endpoint"),
        pytest.param(
            ["--amqp=ssl:5671:privateKey=server.pem"],
            "--amqp: 'ssl:5671:privateKey=server.pem' is not a valid endpoint: TLS support is not installed",
            marks=pytest.mark.skipif(tls_installed(), reason="TLS support is installed here"),
        ),
    ],
)
def test_a_bad_option_exits_with_a_one_line_error(tmp_path, args, complaint):
    result = twistd("-n", "brokerd", *args, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert complaint in result.stderr


def test_a_taken_port_stops_the_broker_with_a_clear_error(broker, tmp_path):
    endpoint = broker.wait_listening("native protocol")
    port = endpoint.rsplit(":", 1)[1]
    second = BrokerProcess(["--native", f"tcp:{port}:interface=127.0.0.1"], cwd=tmp_path)
    status = second.process.wait(60)
    second.stop()
    assert status == 1
    assert any(
        f"brokerd could not start: --native=tcp:{port}:interface=127.0.0.1: " in line
        and "Address already in use" in line
        for line in second.output
    ), second.output
    assert not any("store stats" in line or "Traceback" in line for line in second.output), second.output


def test_start_up_log_names_the_settings_and_warns_of_another_backends_data(tmp_path):
    data = tmp_path / "data"
    chunked = BrokerProcess(["--data-dir", str(data), "--native", "tcp:0:interface=127.0.0.1"], cwd=tmp_path)
    try:
        native = chunked.wait_listening("native protocol")
        amqp = chunked.wait_listening("AMQP")
        assert chunked.wait_for_output(
            rf"brokerd {brokerd.__version__} starting: data directory {data}, backend chunked \(cache_size=64M"
            r" chunk_size=256M .*\), sync always$"
        )
        assert chunked.wait_for_output(rf"AMQP listening on {amqp[4:]} \(--amqp=tcp:0:interface=127.0.0.1\)$")
        assert chunked.wait_for_output(rf"native protocol listening on {native[4:]} \(--native=tcp:0:")

        # A second broker on the same data directory finds the store in use: one line, no store stats.
        second = BrokerProcess(["--data-dir", str(data), "--native", "tcp:0:interface=127.0.0.1"], cwd=tmp_path)
        assert second.process.wait(60) == 1
        second.stop()
        assert [line for line in second.output if "could not start" in line or "store stats" in line] == [
            next(line for line in second.output if "brokerd could not start: " in line and "in use" in line)
        ]
        assert native_cli(native, "declare", "queue", "kept", "--durable").returncode == 0
    finally:
        assert chunked.stop() == 0

    sqlite = BrokerProcess(
        ["--backend=sqlite", "--data-dir", str(data), "--native", "tcp:0:interface=127.0.0.1"], cwd=tmp_path
    )
    try:
        warning = sqlite.wait_for_output("#warn")
        sqlite.wait_listening("AMQP")
    finally:
        sqlite.stop()
    assert f"the data directory holds the chunked backend's files ({data}/chunked)" in warning
    assert warning.endswith(f"stop the broker and run: brokerd-admin migrate --data-dir {data} --from chunked"
                            " --to sqlite")


def test_plugin_is_found_in_this_installation(tmp_path):
    result = twistd("--help", cwd=tmp_path)
    assert "brokerd" in result.stdout


def test_plugin_is_found_after_a_regular_install(tmp_path):
    target = install_copy(tmp_path)
    assert (target / "twisted" / "plugins" / "brokerd_plugin.py").exists()
    assert not (target / "twisted" / "plugins" / "__init__.py").exists(), "would overwrite Twisted's own package"
    assert not (target / "twisted" / "__init__.py").exists()
    run_twistd = [sys.executable, "-S", "-c", "import sys; from twisted.scripts.twistd import run; run()"]
    # -S keeps this checkout (installed editable here) off sys.path: only the
    # fresh install and the dependencies are importable.
    env = isolated_environment(target)
    where = subprocess.run(
        [sys.executable, "-S", "-c", "import brokerd; print(brokerd.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )
    assert where.stdout.startswith(str(target)), where.stdout + where.stderr
    listed = subprocess.run(
        [*run_twistd, "--help"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert "brokerd" in listed.stdout, listed.stdout + listed.stderr
    backends = subprocess.run(
        [*run_twistd, "brokerd", "--help-backends"],
        cwd=tmp_path, env=env, capture_output=True, text=True,
    )
    names = sorted(line.split(":")[0] for line in backends.stdout.splitlines() if not line.startswith(" "))
    assert names == ["chunked", "filelog", "memory", "sqlite"], backends.stdout + backends.stderr


def test_the_service_twistd_makes_leaves_what_exists_at_start_out_of_the_cyclic_collectors_walks(tmp_path):
    # Its full collections then walk only what the broker made since (modules and classes live as long as
    # the process anyway); the store, queues and messages made afterwards stay collectable.
    script = (
        "import gc; from brokerd.process.tap import Options, makeService\n"
        "options = Options()\n"
        f"options.parseOptions(['--backend=memory', '--data-dir={tmp_path}', '--native', 'none', '--amqp', 'none',"
        " '--http', 'none', '--prometheus', 'none'])\n"
        "before = gc.get_freeze_count()\n"
        "makeService(options)\n"
        "print(before, gc.get_freeze_count())\n"
    )
    ran = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    before, after = map(int, ran.stdout.split())
    assert before == 0 and after > 10_000, ran.stdout
