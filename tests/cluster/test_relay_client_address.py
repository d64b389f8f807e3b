"""
What the leader sees of a client a follower relays, on a cluster of real nodes: the client's own address and
port (in /api/connections, its logs and the guest loopback rule), because the follower's relay tells it in a
header signed with the cluster's secret; and what it does with a header it must not believe: one made without
the secret, one sent a second time, one sent to a node that does not lead, each dropped before a byte is answered
and logged with the reason.

One cluster serves every test: leader a, listening on loopback, and follower b, whose AMQP port listens on every
interface (so that a client can reach it from an address that is not loopback). Each refusal is the first on its
node's port, which the node logs at once (later ones within 10 s are summed up in one line).
"""

import base64
import json
import socket
import time
import urllib.request

import pika
import pytest
from pika.exceptions import AMQPConnectionError
from twisted.internet.address import IPv4Address

from brokerd.replication.relay_proof import relay_header
from brokerd.testing import poll_until
from tests.support.addresses import non_loopback_address
from tests.support.cluster import ClusterProcesses
from tests.support.etcd import needs_etcd

pytestmark = needs_etcd

WAIT_SECONDS = 15.0
AMQP_HEADER = b"AMQP\x00\x00\x09\x01"
REFUSED = "before believing its PROXY header: "


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = ClusterProcesses(tmp_path_factory.mktemp("relay-address"), ttl=3, min_isr=1)
    try:
        cluster.start(names=("a",))
        cluster.add("b", options=["--amqp", "tcp:0", "--cluster-advertise-host", "127.0.0.1"]).start()
        cluster["b"].wait_joined()
        yield cluster
    finally:
        cluster.close()


def api(node, path, user=("guest", "guest")):
    host, port = node.addresses()["http"]
    request = urllib.request.Request(f"http://{host}:{port}/api{path}", headers={
        "Authorization": "Basic " + base64.b64encode(":".join(user).encode()).decode(),
        "content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read() or b"null")


def put(node, path, body):
    host, port = node.addresses()["http"]
    request = urllib.request.Request(
        f"http://{host}:{port}/api{path}", method="PUT", data=json.dumps(body).encode(),
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode(),
                 "content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10):
        pass


def connect(host, port, name, credentials=None):
    return pika.BlockingConnection(pika.ConnectionParameters(
        host, port, credentials=credentials or pika.PlainCredentials("guest", "guest"),
        client_properties={"connection_name": name}, connection_attempts=1, socket_timeout=10,
        heartbeat=0))


def listed(node, name):
    """The entry of /api/connections of the connection named C{name}, once it is there."""
    def found():
        return next((entry for entry in api(node, "/connections")
                     if entry.get("client_properties", {}).get("connection_name") == name), None)
    return poll_until(found, WAIT_SECONDS, f"connection {name!r} on node {node.name}")


def local_address(connection):
    return connection._impl._transport._sock.getsockname()


def logged(node, text):
    """The line of C{node}'s latest incarnation that holds C{text}, once there is one."""
    return poll_until(lambda: next((line for line in node.lines() if text in line), None), WAIT_SECONDS,
                      f"{text!r} in node {node.name}'s log\n{node.tail()}")


def secret(cluster):
    """The cluster's shared secret, as its nodes read it from etcd."""
    return base64.b64decode(cluster.etcd_value("secret"))


def client_address(host, port):
    return IPv4Address("TCP", host, port)


def send_and_read(address, data, enough=None):
    """Sends C{data} on a new connection to C{address}: what came back until the node closed it (or until
    C{enough} bytes came), and the connection's local port."""
    with socket.create_connection(address, timeout=WAIT_SECONDS) as sock:
        port = sock.getsockname()[1]
        sock.sendall(data)
        received = b""
        while enough is None or len(received) < enough:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
    return received, port


def test_a_client_relayed_by_a_follower_is_seen_by_the_leader_at_its_own_address_and_port(cluster):
    leader, follower = cluster["a"], cluster["b"]
    _, port = follower.amqp_address()
    with connect("127.0.0.1", port, "through-b") as connection:
        host, local_port = local_address(connection)
        entry = listed(leader, "through-b")
        assert connection._impl.server_properties["node"] == "brokerd@a"
    assert (entry["peer_host"], entry["peer_port"]) == (host, local_port)
    assert entry["name"].startswith(f"{host}:{local_port} -> ")
    logged(leader, f"accepted AMQP connection {host}:{local_port} -> ")


def test_guest_reaching_a_follower_from_an_address_that_is_not_loopback_is_refused_as_on_the_leader(cluster):
    address = non_loopback_address()
    if address is None:
        pytest.skip("this machine has no address but loopback ones")
    leader, follower = cluster["a"], cluster["b"]
    _, port = follower.amqp_address()
    with pytest.raises(AMQPConnectionError) as refused:
        connect(address, port, "guest-from-afar")
    assert "user 'guest' can only connect via localhost" in str(refused.value)
    logged(leader, f"refused AMQP client {address}:")
    put(leader, "/users/remote", {"password": "far-away", "tags": ""})
    put(leader, "/permissions/%2F/remote", {"configure": ".*", "write": ".*", "read": ".*"})
    with connect(address, port, "remote-user", pika.PlainCredentials("remote", "far-away")) as connection:
        _, local_port = local_address(connection)
        entry = listed(leader, "remote-user")
    assert (entry["peer_host"], entry["peer_port"]) == (address, local_port)


def test_a_header_made_without_the_clusters_secret_is_dropped_by_the_leader_and_logged(cluster):
    leader = cluster["a"]
    forged = relay_header(b"not the cluster's secret" * 2, "b", "a", client_address("203.0.113.7", 4242),
                          client_address("127.0.0.1", 5672), time.time())
    received, port = send_and_read(leader.amqp_address(), forged + AMQP_HEADER)
    assert received == b"", "not even connection.start: nothing after the header was read"
    line = logged(leader, f"refused --amqp client 127.0.0.1:{port} {REFUSED}")
    assert "its MAC is not made with this cluster's secret" in line
    assert not [entry for entry in api(leader, "/connections") if entry["peer_host"] == "203.0.113.7"]
    # The same bytes less the header are answered (connection.start): the header alone was refused.
    answered, _ = send_and_read(leader.amqp_address(), AMQP_HEADER, enough=7)
    assert answered.startswith(b"\x01\x00\x00")


def test_a_header_of_the_cluster_sent_again_is_refused_as_a_replay(cluster):
    leader = cluster["a"]
    host, port = leader.addresses()["http"]
    header = relay_header(secret(cluster), "b", "a", client_address("203.0.113.7", 4242),
                          client_address("127.0.0.1", 5672), time.time())
    request = (b"GET /api/whoami HTTP/1.0\r\nAuthorization: Basic "
               + base64.b64encode(b"guest:guest") + b"\r\n\r\n")
    believed, _ = send_and_read((host, port), header + request)
    # Believed: the client it names, at 203.0.113.7, is not on loopback, where guest must be.
    assert believed.split(b"\r\n", 1)[0].endswith(b" 401 Unauthorized")
    assert b"User can only log in via localhost" in believed
    replayed, local_port = send_and_read((host, port), header + request)
    assert replayed == b""
    line = logged(leader, f"refused --http client 127.0.0.1:{local_port} {REFUSED}")
    assert "a replay of node b's header" in line


def test_a_header_sent_to_a_node_that_does_not_lead_is_refused(cluster):
    follower = cluster["b"]
    _, port = follower.amqp_address()
    header = relay_header(secret(cluster), "c", "b", client_address("127.0.0.1", 4242),
                          client_address("127.0.0.1", port), time.time())
    received, local_port = send_and_read(("127.0.0.1", port), header + AMQP_HEADER)
    assert received == b""
    line = logged(follower, f"refused --amqp client 127.0.0.1:{local_port} {REFUSED}")
    assert "node b does not lead the cluster" in line
