"""twistd's pid file goes into the broker's data directory, so brokers started in one directory all start.

Two real ``twistd -n brokerd`` processes, without ``--pidfile``, in one working directory with their own data
directories and ports: both listen, each pid file (``DATA_DIR/brokerd.pid``) holds its broker's process id and
none is written to the working directory. A third on the first one's data directory is refused by twistd, as
a second RabbitMQ node on one data directory is; a stopped broker leaves no pid file behind.
"""

import pytest

from brokerd.testing import BrokerProcess

pytestmark = pytest.mark.long_module(seconds=8)  # started early (tests/conftest.py)


def broker_on(cwd, data_dir):
    """A broker on data directory C{data_dir} (relative to C{cwd}), with twistd's default pid file option."""
    return BrokerProcess(["--backend=memory", "--data-dir", data_dir, "--native", "tcp:0:interface=127.0.0.1"],
                         cwd=cwd, pidfile=None)


def test_two_brokers_in_one_directory_both_listen_each_with_its_pid_file_in_its_data_directory(tmp_path):
    first = broker_on(tmp_path, "first")
    try:
        second = broker_on(tmp_path, "second")
        try:
            for broker in (first, second):
                broker.wait_listening("AMQP")
                broker.wait_listening("native protocol")
                broker.wait_listening("HTTP API")
            assert (tmp_path / "first" / "brokerd.pid").read_text().strip() == str(first.process.pid)
            assert (tmp_path / "second" / "brokerd.pid").read_text().strip() == str(second.process.pid)
            assert not (tmp_path / "twistd.pid").exists()

            third = broker_on(tmp_path, "first")
            assert third.process.wait(60) != 0
            third.stop()
            assert any("Another twistd server is running, PID " + str(first.process.pid) in line
                       for line in third.output), third.tail()
        finally:
            assert second.stop() == 0
    finally:
        assert first.stop() == 0
    assert not (tmp_path / "first" / "brokerd.pid").exists()
    assert not (tmp_path / "second" / "brokerd.pid").exists()
