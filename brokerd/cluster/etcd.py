"""
A client of etcd's v3 API over its JSON gateway (etcd 3.4 and 3.5 serve it under C{/v3/}): keys
(range, put, delete, transactions) and leases (grant, keep-alive, revoke, time to live). Every
call returns a Deferred and never blocks the reactor; every answer is read with a size bound and
checked field by field (L{decode}). Keys and values are bytes (a str is taken as UTF-8).
"""

import json
from dataclasses import dataclass

from twisted.internet import defer

from brokerd.cluster import decode
from brokerd.cluster.errors import EtcdRefused, LeaseNotFound, MalformedResponse
from brokerd.cluster.gateway import Gateway

# Answers are small (the cluster keeps a handful of short keys); a bigger one is not etcd's.
MAX_ANSWER_BYTES = 1024 * 1024
# gRPC's NOT_FOUND, which etcd gives for a lease it does not know.
GRPC_NOT_FOUND = 5


def as_bytes(data):
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


def prefix_end(prefix):
    """The first key after every key starting with C{prefix} (etcd's C{range_end} for a
    prefix)."""
    prefix = as_bytes(prefix)
    for index in range(len(prefix) - 1, -1, -1):
        if prefix[index] < 0xFF:
            return prefix[:index] + bytes([prefix[index] + 1])
    return b"\0"


def key_range(key, prefix):
    """The gateway's C{key} (and C{range_end} for a prefix) fields."""
    fields = {"key": decode.encode(as_bytes(key))}
    if prefix:
        fields["range_end"] = decode.encode(prefix_end(key))
    return fields


# Comparisons and operations of a transaction, as the gateway spells them.

def key_absent(key):
    """Compare: C{key} does not exist (its create revision is 0)."""
    return {"target": "CREATE", "result": "EQUAL", "key": decode.encode(as_bytes(key)),
            "create_revision": "0"}


def mod_revision_is(key, revision):
    """Compare: C{key} was last changed at C{revision} (0: the key does not exist)."""
    return {"target": "MOD", "result": "EQUAL", "key": decode.encode(as_bytes(key)),
            "mod_revision": str(revision)}


def value_is(key, value):
    """Compare: C{key} holds C{value} (false when the key does not exist)."""
    return {"target": "VALUE", "result": "EQUAL", "key": decode.encode(as_bytes(key)),
            "value": decode.encode(as_bytes(value))}


def lease_is(key, lease):
    """Compare: C{key} lives under lease C{lease}."""
    return {"target": "LEASE", "result": "EQUAL", "key": decode.encode(as_bytes(key)),
            "lease": str(lease)}


def put_request(key, value, lease=0):
    """Operation: put C{value} at C{key}, under C{lease} (0: none)."""
    fields = {"key": decode.encode(as_bytes(key)), "value": decode.encode(as_bytes(value))}
    if lease:
        fields["lease"] = str(lease)
    return {"request_put": fields}


def range_request(key, prefix=False):
    """Operation: read C{key} (or every key under it, with C{prefix})."""
    return {"request_range": key_range(key, prefix)}


def delete_request(key, prefix=False):
    """Operation: delete C{key} (or every key under it, with C{prefix})."""
    return {"request_delete_range": key_range(key, prefix)}


@dataclass(frozen=True)
class RangeResult:
    """The keys read (L{decode.KeyValue}s) and the store's revision they were read at."""

    kvs: list
    revision: int


@dataclass(frozen=True)
class TxnResult:
    """
    Whether every comparison held, the store's revision after it, and the answers of the
    operations that ran, in order: a L{RangeResult} for a range, the revision for a put, the
    number of keys deleted for a delete.
    """

    succeeded: bool
    revision: int
    responses: list


@dataclass(frozen=True)
class Lease:
    """A lease etcd granted: its id and its TTL in seconds."""

    id: int
    ttl: int


class EtcdClient:
    """
    Talks to an etcd cluster through L{Gateway}.

    @ivar gateway: the endpoints and the HTTP under this client (L{watch} opens streams on it).
    """

    def __init__(self, reactor, urls, ca_file=None, timeout=5.0, max_answer=MAX_ANSWER_BYTES):
        self.gateway = Gateway(reactor, urls, ca_file=ca_file, timeout=timeout)
        self._max_answer = max_answer

    @defer.inlineCallbacks
    def call(self, path, request, timeout=None):
        """POSTs C{request} (a dict) to C{path}; fires with etcd's answer as a checked JSON object,
        or L{EtcdRefused} when etcd answered with an error."""
        body = json.dumps(request).encode("utf-8")
        url, status, data = yield self.gateway.post(path, body, self._max_answer, timeout)
        where = f"etcd at {url.decode()}"
        if status != 200:
            try:
                answer = decode.parse_json_object(data, where)
            except MalformedResponse:
                # Not the gateway's error object: a wrong path or something else than etcd.
                shown = data[:100].decode("utf-8", "replace").strip() or "no message"
                raise EtcdRefused(url.decode(), status, 0, shown) from None
            code = decode.integer(answer, "code", where)
            detail = decode.text(answer, "message", where) or decode.text(answer, "error", where)
            if code == GRPC_NOT_FOUND and "lease not found" in detail:
                raise LeaseNotFound(f"{where}: {detail}")
            raise EtcdRefused(url.decode(), status, code, detail[:200] or "no message")
        return decode.parse_json_object(data, where) if data else {}

    @defer.inlineCallbacks
    def range(self, key, prefix=False):
        """The value of C{key} (or of every key under it, with C{prefix}): a L{RangeResult}."""
        answer = yield self.call(b"/v3/kv/range", key_range(key, prefix))
        return read_range(answer, "range")

    @defer.inlineCallbacks
    def put(self, key, value, lease=0):
        """Sets C{key} to C{value}, under C{lease} (0: none); fires with the new revision."""
        answer = yield self.call(b"/v3/kv/put", put_request(key, value, lease)["request_put"])
        return decode.header_revision(answer, "put")

    @defer.inlineCallbacks
    def delete(self, key, prefix=False):
        """Deletes C{key} (or every key under it, with C{prefix}); fires with how many went."""
        answer = yield self.call(b"/v3/kv/deleterange", key_range(key, prefix))
        return decode.integer(answer, "deleted", "deleterange")

    @defer.inlineCallbacks
    def txn(self, compare, success=(), failure=()):
        """
        Runs C{success} if every comparison of C{compare} holds, else C{failure}, atomically
        (the comparisons and operations built by this module's helpers); fires with a
        L{TxnResult}.
        """
        request = {"compare": list(compare), "success": list(success), "failure": list(failure)}
        answer = yield self.call(b"/v3/kv/txn", request)
        succeeded = decode.boolean(answer, "succeeded", "txn")
        expected = len(request["success"] if succeeded else request["failure"])
        responses = [read_op(item, f"txn responses[{index}]")
                     for index, item in enumerate(decode.array(answer, "responses", "txn"))]
        if len(responses) != expected:
            raise MalformedResponse(f"txn: {len(responses)} responses for {expected} operations")
        return TxnResult(succeeded, decode.header_revision(answer, "txn"), responses)

    @defer.inlineCallbacks
    def lease_grant(self, ttl):
        """A new L{Lease} of C{ttl} seconds."""
        answer = yield self.call(b"/v3/lease/grant", {"TTL": str(int(ttl))})
        lease = Lease(decode.integer(answer, "ID", "lease grant"),
                      decode.integer(answer, "TTL", "lease grant"))
        if lease.id == 0 or lease.ttl <= 0:
            detail = decode.text(answer, "error", "lease grant") or "no id or TTL"
            raise MalformedResponse(f"lease grant: etcd granted no lease ({detail[:200]})")
        return lease

    @defer.inlineCallbacks
    def lease_keepalive(self, lease_id, timeout=None):
        """Renews lease C{lease_id}; fires with its TTL again in seconds, or L{LeaseNotFound}
        when it is gone."""
        answer = yield self.call(b"/v3/lease/keepalive", {"ID": str(lease_id)}, timeout)
        result = decode.member(answer, "result", "lease keepalive")
        if decode.integer(result, "ID", "lease keepalive") != lease_id:
            raise MalformedResponse(f"lease keepalive: the answer is not about lease {lease_id}")
        ttl = decode.integer(result, "TTL", "lease keepalive")
        if ttl <= 0:
            raise LeaseNotFound(f"lease {lease_id:x} is gone (expired or revoked)")
        return ttl

    @defer.inlineCallbacks
    def lease_time_to_live(self, lease_id):
        """The seconds lease C{lease_id} has left, or L{LeaseNotFound}."""
        answer = yield self.call(b"/v3/lease/timetolive", {"ID": str(lease_id)})
        ttl = decode.integer(answer, "TTL", "lease timetolive")
        if ttl < 0:
            raise LeaseNotFound(f"lease {lease_id:x} is gone (expired or revoked)")
        return ttl

    @defer.inlineCallbacks
    def lease_revoke(self, lease_id):
        """Ends lease C{lease_id} now, deleting every key under it."""
        yield self.call(b"/v3/lease/revoke", {"ID": str(lease_id)})


def read_range(obj, what):
    return RangeResult(decode.key_values(obj, what), decode.header_revision(obj, what))


def read_op(item, what):
    """One answer of a transaction's operations (see L{TxnResult})."""
    obj = decode.json_object(item, what)
    if "response_range" in obj:
        return read_range(decode.member(obj, "response_range", what), what)
    if "response_put" in obj:
        return decode.header_revision(decode.member(obj, "response_put", what), what)
    if "response_delete_range" in obj:
        return decode.integer(decode.member(obj, "response_delete_range", what), "deleted", what)
    raise MalformedResponse(f"{what}: no response_range, response_put or response_delete_range")
