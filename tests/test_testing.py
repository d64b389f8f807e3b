"""brokerd.testing: the one broker-subprocess helper of the tests, the benchmarks and the validation runs."""

import signal
import subprocess
import sys

import pytest

from brokerd.testing import BrokerFailed, BrokerProcess, parse_endpoint


def test_a_broker_restarts_on_the_same_command_and_its_log_keeps_every_incarnation(tmp_path):
    with open(tmp_path / "broker.log", "w", encoding="utf-8") as log:
        broker = BrokerProcess(["--backend=memory", "--native", "none"], tmp_path, log=log)
        try:
            assert broker.wait_address("AMQP")[0] == "127.0.0.1"
            first = broker.process

            assert broker.restart(crash=True) == -signal.SIGKILL
            assert broker.process is not first and first.returncode == -signal.SIGKILL
            broker.wait_listening("AMQP")

            assert broker.restart() == 0
            broker.wait_listening("AMQP")
        finally:
            assert broker.stop() == 0
    # output and listening describe the last incarnation only; the log file has all three.
    [listening] = [line for line in broker.output if "AMQP listening on" in line]
    assert f"AMQP listening on {broker.listening['AMQP'][4:]} " in listening
    assert "brokerd stopped cleanly" in broker.tail(5)
    logged = (tmp_path / "broker.log").read_text(encoding="utf-8")
    assert logged.count("AMQP listening on") == 3
    assert logged.count("brokerd stopped cleanly") == 2


def test_a_broker_that_cannot_start_fails_the_wait_with_its_last_lines(tmp_path):
    broker = BrokerProcess(["--backend=memory", "--native", "none", "--heartbeat=-1"], tmp_path)
    with pytest.raises(BrokerFailed, match=r"exited with status 1 before AMQP listened; its last lines:\n"
                                           r".*--heartbeat: '-1' is not a number of seconds"):
        broker.wait_listening("AMQP")
    with pytest.raises(BrokerFailed, match="printed no line matching 'never printed'"):
        broker.wait_for_output("never printed")
    assert broker.stop() == 1


def test_an_endpoint_string_gives_host_and_port():
    assert parse_endpoint("tcp:127.0.0.1:5672") == ("127.0.0.1", 5672)


def test_importing_brokerd_testing_does_not_import_pytest():
    """It ships with the broker, where pytest is not installed."""
    code = "import sys, brokerd.testing; assert 'pytest' not in sys.modules and '_pytest' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
