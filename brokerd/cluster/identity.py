"""
A cluster's identity in etcd: its id and the secret its nodes prove to each other.

The first node of a cluster creates both, in one etcd transaction that succeeds only
where neither exists; every later node reads them. The id marks each follower's data
as this cluster's (a data directory of another cluster is refused, named); the secret
authenticates replication links (challenge and response: it never travels between
nodes). Both live under C{/{prefix}/{cluster}/}, readable by whoever may read the
cluster's keys in etcd, as LavinMQ keeps its cluster secret.
"""

import base64
import binascii
import os
import re
import uuid
from dataclasses import dataclass

from twisted.internet import defer

from brokerd.cluster import etcd
from brokerd.cluster.errors import MalformedResponse

SECRET_BYTES = 32
ID_PATTERN = re.compile(rb"[0-9a-f]{32}")


@dataclass(frozen=True)
class ClusterIdentity:
    """A cluster's id (32 hexadecimal digits) and its replication secret (bytes)."""

    cluster_id: str
    secret: bytes = b""

    def __repr__(self):
        return f"ClusterIdentity({self.cluster_id!r}, secret=...)"


def _read(kvs, key, what):
    for kv in kvs:
        if kv.key == key:
            return kv.value
    raise MalformedResponse(f"the cluster's {what} ({key.decode()}) is missing in etcd")


@defer.inlineCallbacks
def cluster_identity(client, keys):
    """
    Fires with this cluster's L{ClusterIdentity}, made now if the cluster is new; fails
    with L{MalformedResponse} naming the key when what etcd holds is not one.
    """
    id_key, secret_key = keys.root + b"id", keys.root + b"secret"
    made = ClusterIdentity(uuid.uuid4().hex, os.urandom(SECRET_BYTES))
    result = yield client.txn(
        [etcd.key_absent(id_key)],
        [etcd.put_request(id_key, made.cluster_id.encode()),
         etcd.put_request(secret_key, base64.b64encode(made.secret))],
        [etcd.range_request(id_key), etcd.range_request(secret_key)],
    )
    if result.succeeded:
        return made
    cluster_id = _read(result.responses[0].kvs, id_key, "id")
    encoded = _read(result.responses[1].kvs, secret_key, "secret")
    if not ID_PATTERN.fullmatch(cluster_id):
        raise MalformedResponse(f"the cluster id in etcd ({id_key.decode()}) is not 32"
                                f" hexadecimal digits: {cluster_id[:40]!r}")
    try:
        secret = base64.b64decode(encoded[:1024], validate=True)
    except (binascii.Error, ValueError):
        secret = b""
    if len(secret) < SECRET_BYTES:
        raise MalformedResponse(f"the cluster secret in etcd ({secret_key.decode()}) is not"
                                f" {SECRET_BYTES} or more bytes in base64")
    return ClusterIdentity(cluster_id.decode(), secret)
