"""The follower's end of a replication link: authenticates the leader and applies its stream."""

from twisted.internet import defer, protocol
from twisted.logger import Logger

from brokerd.replication import auth, codec
from brokerd.replication.codec import StreamError


class LeaderLink(protocol.Protocol):
    """
    A follower's connection to the leader. It answers the leader's
    challenge, checks the leader's answer to its own (a leader that fails is
    dropped before anything is applied), then hands each operation to the
    L{StoreApplier} and starts a commit after every batch received; each
    finished commit is acknowledged with the last sequence it covers.

    @ivar state: C{"hello"}, C{"welcome"} (answered, awaiting the leader's
        proof), C{"streaming"} or C{"stopped"}.
    """

    log = Logger()

    def __init__(self, client):
        self.client = client
        self.decoder = codec.FrameDecoder(codec.HANDSHAKE_FRAME_LIMIT)
        self.state = "hello"
        self._leader_nonce = None
        self._nonce = auth.nonce()

    def dataReceived(self, data):
        applier = self.client.applier
        try:
            for kind, payload in self.decoder.feed(data):
                if kind == codec.REFUSE:
                    return self._refused(payload)
                if self.state == "streaming" and kind == codec.OPERATION:
                    applier.apply(*codec.decode_operation(payload))
                elif self.state == "hello" and kind == codec.HELLO:
                    self._answer(payload)
                elif self.state == "welcome" and kind == codec.WELCOME:
                    self._welcomed(payload)
                else:
                    raise StreamError(f"leader sent a {codec.KINDS[kind]} frame while"
                                      f" {self.state}")
        except StreamError as problem:
            self._stop(str(problem))
        finally:
            if self.state == "streaming":
                applier.commit()

    def _answer(self, payload):
        size = len(codec.MAGIC) + codec.NONCE_SIZE
        if len(payload) != size or payload[:len(codec.MAGIC)] != codec.MAGIC:
            raise StreamError("the peer is not a brokerd replication leader")
        self._leader_nonce = bytes(payload[len(codec.MAGIC):])
        client, applier = self.client, self.client.applier
        self._resume = applier.applied_sequence
        proof = auth.follower_proof(client.secret, self._leader_nonce, self._nonce,
                                    applier.cluster_id, client.node_name, self._resume)
        self.transport.write(codec.frame(
            codec.AUTH, self._nonce + proof + codec.SEQUENCE.pack(self._resume)
            + codec.pack_name(applier.cluster_id) + codec.pack_name(client.node_name)))
        self.state = "welcome"

    def _welcomed(self, payload):
        if len(payload) < codec.MAC_SIZE:
            raise StreamError(f"welcome frame of {len(payload)} bytes is too short")
        cluster, end = codec.unpack_name(payload, codec.MAC_SIZE, "cluster id")
        expected = auth.leader_proof(self.client.secret, self._leader_nonce, self._nonce, cluster)
        if end != len(payload) or not auth.same(expected, bytes(payload[:codec.MAC_SIZE])):
            raise StreamError("the leader failed authentication (wrong secret)")
        applier = self.client.applier
        if applier.cluster_id and applier.cluster_id != cluster:
            raise StreamError(f"the leader is of cluster {cluster!r}; this node's data is of"
                              f" cluster {applier.cluster_id!r}")
        applier.adopt_cluster(cluster)
        applier.on_durable = self._acknowledge
        applier.on_failure = lambda failure: self._stop(f"commit failed: {failure.value}")
        self.decoder.limit = self.client.max_frame
        self.state = "streaming"
        self.log.info("replicating from the leader of cluster {cluster} from operation {resume}",
                      cluster=cluster, resume=self._resume + 1)

    def _acknowledge(self, sequence):
        if self.state == "streaming":
            self.transport.write(codec.frame(codec.ACK, codec.SEQUENCE.pack(sequence)))
            self.client.acks_sent += 1

    def _refused(self, payload):
        reason = bytes(payload).decode("utf-8", "replace")
        self._stop(f"the leader refused this node: {reason}")

    def _stop(self, reason):
        self.state = "stopped"
        self.client.stopped(reason)
        self.transport.abortConnection()

    def connectionLost(self, reason):
        if self.state in ("hello", "welcome"):
            self.client.stopped(f"the leader closed the connection while {self.state}"
                                f" (wrong secret, or not a replication port)")
        applier = self.client.applier
        applier.on_durable = lambda sequence: None
        applier.on_failure = lambda failure: None
        self.state = "stopped"
        self.client.lost(self)


class ReplicationClient(protocol.ClientFactory):
    """
    Connects a follower's L{StoreApplier} to a leader (connect with any
    Twisted endpoint). Reconnecting is its owner's choice: a new connection
    resumes after the last operation applied.

    @ivar reason: why the last link was stopped (refused by the leader, a
        protocol fault, a failed commit), or None.
    """

    log = Logger()

    def __init__(self, applier, secret, node_name, *, max_frame=codec.DEFAULT_FRAME_LIMIT):
        self.applier = applier
        self.secret = secret
        self.node_name = node_name
        self.max_frame = max_frame
        self.reason = None
        self.acks_sent = 0
        self.link = None
        self._lost_waiters = []

    def buildProtocol(self, addr):
        self.link = LeaderLink(self)
        return self.link

    def stopped(self, reason):
        self.reason = reason
        self.log.warn("replication link stopped: {reason}", reason=reason)

    def lost(self, link):
        if link is self.link:
            self.link = None
        waiters, self._lost_waiters = self._lost_waiters, []
        for waiter in waiters:
            waiter.callback(self.reason)

    def when_lost(self):
        """A Deferred firing with L{reason} when the current link closes."""
        if self.link is None:
            return defer.succeed(self.reason)
        waiter = defer.Deferred()
        self._lost_waiters.append(waiter)
        return waiter
