"""A real ``twistd brokerd`` for the client-library tests, one per test module.

Each module gets its own broker subprocess (memory backend, AMQP and native
listeners on port 0) so modules cannot disturb each other's queues; tests
inside a module use their own queue names.
"""

import pytest

from tests.processes import BrokerProcess


class RunningBroker:
    """Where a broker subprocess listens."""

    def __init__(self, process):
        self.process = process
        amqp = process.wait_listening("AMQP")
        native = process.wait_listening("native protocol")
        _, self.host, port = amqp.split(":")
        self.amqp_port = int(port)
        self.native_endpoint = native

    @property
    def amqp_url(self):
        return f"amqp://guest:guest@{self.host}:{self.amqp_port}/%2F"


def start_broker(directory, *extra_args):
    """Start a broker with AMQP and native listeners on free ports; returns a RunningBroker."""
    process = BrokerProcess(
        ["--native", "tcp:0:interface=127.0.0.1", "--amqp", "tcp:0:interface=127.0.0.1", *extra_args], cwd=directory
    )
    try:
        return RunningBroker(process)
    except BaseException:
        process.kill()
        raise


@pytest.fixture(scope="module")
def amqp_broker(tmp_path_factory):
    """A broker subprocess shared by the tests of one module."""
    running = start_broker(tmp_path_factory.mktemp("broker"))
    yield running
    running.process.stop()
