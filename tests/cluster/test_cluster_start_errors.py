"""
A cluster node that cannot take its place stops at once, non-zero, with one line saying why:
etcd unreachable at its first start (naming the URL), a name another live node holds (naming
the name), a data directory of another cluster (naming both clusters).
"""

import pytest

from tests.support.cluster import (
    ConfirmedPublisher,
    make_cluster,  # noqa: F401 (fixture)
)
from tests.support.etcd import free_port, needs_etcd

pytestmark = needs_etcd

EXIT_SECONDS = 30


def exit_and_reason(node):
    """The node's exit status, once it exited, and its lines naming why it could not join."""
    status = node.process.process.wait(EXIT_SECONDS)
    node.process.kill()  # reaps its output reader
    lines = [line for line in node.process.output if "could not join cluster" in line]
    return status, lines


def test_a_node_that_cannot_reach_etcd_at_its_first_start_exits_naming_the_url(make_cluster):
    cluster = make_cluster()
    unreachable = f"http://127.0.0.1:{free_port()}"
    node = cluster.add("a")
    node.start(etcd_url=unreachable)
    status, lines = exit_and_reason(node)
    assert status != 0
    assert len(lines) == 1 and unreachable in lines[0], node.tail()


def test_a_second_live_node_with_a_taken_name_exits_naming_the_name(make_cluster):
    cluster = make_cluster().start(names=("a",))
    twin = cluster.add("twin", options=())
    # The same node name as the running leader, with its own data directory.
    twin.command = lambda etcd_url=None, base=twin.command: [
        "a" if word == "twin" else word for word in base(etcd_url)]
    twin.start()
    status, lines = exit_and_reason(twin)
    assert status != 0
    assert len(lines) == 1 and "'a'" in lines[0] and "taken" in lines[0], twin.tail()
    assert cluster["a"].running() and cluster.leader() is cluster["a"]


@pytest.mark.parametrize("backend", ["chunked", "sqlite"])
def test_a_follower_whose_data_belongs_to_another_cluster_exits_naming_both(make_cluster, backend):
    first = make_cluster(cluster_name="first")
    first.start(names=("a", "b"), backends={"b": backend})
    first.wait_in_sync_set(["a", "b"])
    # The follower's data is the first cluster's once it applied some of it.
    publisher = ConfirmedPublisher(lambda: [first["a"].amqp_address()], "orders", limit=5)
    publisher.start()
    publisher.wait_confirms(5)
    publisher.finish()
    first_id = first.etcd_value("id").decode()
    follower = first["b"]
    follower.stop()
    # The same data directory, now told to join cluster "second" in the same etcd.
    second = make_cluster(cluster_name="second", etcd=first.etcd).start(names=("a",))
    stray = second.add("b", backend)
    stray.data_dir = follower.data_dir
    stray.start()
    status, lines = exit_and_reason(stray)
    assert status != 0
    assert len(lines) == 1, stray.tail()
    assert first_id in lines[0] and "'second'" in lines[0], lines[0]
