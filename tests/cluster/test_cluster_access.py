"""
What a cluster replicates besides messages: users, vhosts, permissions and policies made through
any node's management API (a follower relays it to the leader) are on the node that takes over,
and a vhost with a store of its own, which no follower would copy, is refused naming why.
"""

import base64
import json
import urllib.error
import urllib.request

import pika
import pytest

from tests.support.cluster import make_cluster  # noqa: F401 (fixture)
from tests.support.etcd import needs_etcd

pytestmark = needs_etcd


def api(address, method, path, body=None, user=("guest", "guest")):
    host, port = address
    request = urllib.request.Request(
        f"http://{host}:{port}/api{path}", method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": "Basic " + base64.b64encode(":".join(user).encode()).decode(),
                 "content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        data = answer.read()
    return json.loads(data) if data else None


def test_access_made_through_a_follower_is_on_the_node_that_takes_over(make_cluster):
    cluster = make_cluster(ttl=3, min_isr=2).start()
    leader = cluster.wait_leader()
    cluster.wait_in_sync_set(["a", "b", "c"])
    follower = cluster.followers(leader)[0]
    through = follower.addresses()["http"]
    api(through, "PUT", "/vhosts/team")
    api(through, "PUT", "/users/alice", {"password": "s3cret", "tags": "management"})
    api(through, "PUT", "/permissions/team/alice", {"configure": ".*", "write": ".*", "read": ".*"})
    api(through, "PUT", "/policies/team/lengths",
        {"pattern": "^q", "definition": {"max-length": 5}, "apply-to": "queues"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        api(through, "PUT", "/vhosts/own", {"backend": "sqlite"})
    assert "cannot have a store of its own in a cluster" in refused.value.read().decode()
    host, port = leader.amqp_address()
    with pika.BlockingConnection(pika.ConnectionParameters(
            host, port, "team", pika.PlainCredentials("alice", "s3cret"))) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("q1", durable=True)
        for number in range(8):
            channel.basic_publish("", "q1", b"%d" % number, pika.BasicProperties(delivery_mode=2))
    cluster.wait_in_sync_set(["a", "b", "c"])
    leader.kill()
    new = cluster.wait_leader(timeout=10, other_than=leader)
    http = new.addresses()["http"]
    assert [user["name"] for user in api(http, "GET", "/users") if user["name"] == "alice"] == ["alice"]
    assert {"team"} <= {vhost["name"] for vhost in api(http, "GET", "/vhosts")}
    assert api(http, "GET", "/policies/team/lengths")["definition"] == {"max-length": 5}
    host, port = new.amqp_address()
    with pika.BlockingConnection(pika.ConnectionParameters(
            host, port, "team", pika.PlainCredentials("alice", "s3cret"))) as connection:
        declared = connection.channel().queue_declare("q1", durable=True, passive=True)
    assert declared.method.message_count == 5, "the policy's max-length held on the new leader too"
