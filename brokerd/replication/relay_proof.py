"""
A follower's word to the leader about who a relayed client is, and the leader's reasons to
believe it.

A follower's relay starts each connection to the leader with a PROXY protocol v2 header
(L{brokerd.wire.proxy_header}) naming the client's address and port and the follower's
listener it reached, followed by one field of brokerd's (L{PROOF_FIELD}): a version, the
time it was made, a fresh random nonce, the follower's node name, the leader's, and an
HMAC-SHA256 under the cluster's shared secret over everything before it. The leader
(L{RelayHeaderCheck}) believes a header only if its MAC is the cluster's (so only a node
holding the secret made it, and nothing in it was changed on the way), it was made for this
node, less than L{MAX_AGE} seconds ago (or ahead), and its nonce was not seen before (so a
header copied off the wire is refused, however soon it is sent again). A PROXY header without
the proof, a load balancer's or a client's, is never believed.
"""

import collections
import hashlib
import hmac
import os
import struct

from brokerd.replication import auth
from brokerd.replication.codec import NAME_LIMIT, StreamError, pack_name, unpack_name
from brokerd.wire import proxy_header
from brokerd.wire.proxy_header import HeaderRefused

PROOF_FIELD = 0xE0  # the first of the PROXY protocol's types for applications' own fields
VERSION = 1
STAMP = struct.Struct(">BQ")  # version, milliseconds since the epoch
NONCE_SIZE = 16
MAC_SIZE = 32
MAX_AGE = 10.0  # seconds a header is good for, either way of the leader's clock
LABEL = b"brokerd relay\0"
# The longest header a relay sends: two IPv6 addresses and ports, the proof field's type and
# length, and the proof with two names of the most bytes a name may have.
MAX_BODY = (36 + proxy_header.TLV_HEADER.size + STAMP.size + NONCE_SIZE
            + 2 * (1 + NAME_LIMIT) + MAC_SIZE)


def relay_header(secret, relayed_by, leader, client, listener, now, nonce=None):
    """
    The header a follower (node C{relayed_by}) sends node C{leader} before the bytes of a
    client at C{client} that connected to C{listener} (Twisted TCP addresses), at time C{now}
    (seconds since the epoch); ValueError if the addresses cannot be framed.
    """
    nonce = os.urandom(NONCE_SIZE) if nonce is None else nonce
    proof = (STAMP.pack(VERSION, int(now * 1000)) + nonce + pack_name(relayed_by)
             + pack_name(leader))
    unsigned = proxy_header.encode(
        client, listener, proxy_header.field(PROOF_FIELD, proof + bytes(MAC_SIZE)))
    signed = unsigned[:-MAC_SIZE]
    return signed + _mac(secret, signed)


def _mac(secret, signed):
    return hmac.new(secret, LABEL + signed, hashlib.sha256).digest()


class RelayHeaderCheck:
    """
    What a leader believes of relay headers (see the module's description): L{check} answers
    the client's address of a header that passes, and remembers its nonce for as long as the
    header could pass for its age: twice C{max_age}, as one may be dated ahead by C{max_age}
    (only a header whose MAC passed takes a place there).
    """

    def __init__(self, secret, node_name, clock, max_age=MAX_AGE):
        self.secret = secret
        self.node_name = node_name
        self.clock = clock
        self.max_age = max_age
        self._seen = {}  # nonce -> when it was seen
        self._expiring = collections.deque()  # (when seen, nonce), oldest first

    @property
    def remembered(self):
        """How many nonces are remembered now."""
        return len(self._seen)

    def check(self, header):
        """
        The client's address the whole header C{header} (bytes) names, if it is to be
        believed; raises L{HeaderRefused} saying why not.
        """
        decoded = proxy_header.decode(header, MAX_BODY)
        if not decoded.fields or decoded.fields[-1][0] != PROOF_FIELD:
            raise HeaderRefused("a PROXY header without a cluster node's proof as its last"
                                " field is not believed")
        proof = decoded.fields[-1][1]
        if len(proof) < STAMP.size + NONCE_SIZE + MAC_SIZE:
            raise HeaderRefused(f"its proof of {len(proof)} bytes is too short to hold one")
        if not auth.same(_mac(self.secret, header[:-MAC_SIZE]), header[-MAC_SIZE:]):
            raise HeaderRefused("its MAC is not made with this cluster's secret (a node of another"
                                " cluster, a forgery, or altered on the way)")
        version, sent_ms = STAMP.unpack_from(proof)
        if version != VERSION:
            raise HeaderRefused(f"its proof is of version {version}, not {VERSION}")
        nonce = proof[STAMP.size:STAMP.size + NONCE_SIZE]
        try:
            relayed_by, at = unpack_name(proof, STAMP.size + NONCE_SIZE, "the relay's name")
            leader, at = unpack_name(proof, at, "the leader's name")
        except StreamError as problem:
            raise HeaderRefused(str(problem)) from None
        if at != len(proof) - MAC_SIZE:
            raise HeaderRefused("its proof has bytes after the leader's name")
        if leader != self.node_name:
            raise HeaderRefused(f"node {relayed_by} made it for node {leader}, not for this"
                                f" node ({self.node_name})")
        now = self.clock.seconds()
        self._forget_before(now - 2 * self.max_age)
        age = now - sent_ms / 1000
        if abs(age) > self.max_age:
            when = f"{age:.1f} s ago" if age > 0 else f"{-age:.1f} s ahead of this node's clock"
            raise HeaderRefused(f"node {relayed_by} made it {when}, past the {self.max_age:g} s"
                                " a relay header is good for (a replay, or the nodes' clocks"
                                " differ)")
        if nonce in self._seen:
            raise HeaderRefused(f"it was seen {now - self._seen[nonce]:.1f} s ago: a replay of"
                                f" node {relayed_by}'s header")
        self._seen[nonce] = now
        self._expiring.append((now, nonce))
        return decoded.source

    def _forget_before(self, moment):
        """Forget the nonces seen before C{moment}: their headers are refused for their age."""
        expiring = self._expiring
        while expiring and expiring[0][0] < moment:
            _, nonce = expiring.popleft()
            self._seen.pop(nonce, None)
