"""The follower's end of a replication link: authenticates the leader and applies its stream."""

from twisted.internet import defer, protocol
from twisted.logger import Logger

from brokerd.replication import auth, codec
from brokerd.replication.codec import StreamError


# Bytes of a snapshot received between two of its commits: few fsyncs, bounded buffers.
SNAPSHOT_COMMIT_BYTES = 8 * 1024 * 1024


class LeaderLink(protocol.Protocol):
    """
    A follower's connection to the leader. It answers the leader's
    challenge with its stores' position (epoch, sequence, whether they can
    resume at all), checks the leader's answer to its own (a leader that
    fails is dropped before anything is applied), then hands each operation
    to the L{StoreApplier} and starts a commit after every batch received;
    each finished commit is acknowledged with the last sequence it covers.
    Told to resync, it wipes its stores (unless its client forbids it), says
    it is ready, applies the snapshot, then the stream after it. A snapshot
    is committed every L{SNAPSHOT_COMMIT_BYTES} received, not after every
    batch: nothing of it is acknowledged before its end (a crash in its
    middle resyncs anyway), and a store that commits on the reactor's thread
    would otherwise fsync once per read.

    @ivar state: C{"hello"}, C{"welcome"} (answered, awaiting the leader's
        proof), C{"streaming"}, C{"wiping"}, C{"snapshot"} or C{"stopped"}.
    """

    log = Logger()

    def __init__(self, client):
        self.client = client
        self.decoder = codec.FrameDecoder(codec.HANDSHAKE_FRAME_LIMIT)
        self.state = "hello"
        self._leader_nonce = None
        self._nonce = auth.nonce()
        self._first = False  # the welcome came, nothing after it yet
        self._snapshot_bytes = 0  # received since the snapshot's last commit

    def dataReceived(self, data):
        applier = self.client.applier
        try:
            for kind, payload in self.decoder.feed(data):
                if self.state == "stopped":
                    return
                if kind == codec.REFUSE:
                    return self._refused(payload)
                first, self._first = self._first, False
                if self.state == "streaming" and kind == codec.OPERATION:
                    applier.apply_payload(payload)
                elif self.state == "snapshot" and kind == codec.SNAPSHOT:
                    applier.apply_snapshot(*codec.decode_operation(payload))
                elif self.state == "snapshot" and kind == codec.SNAPSHOT_END:
                    applier.finish_snapshot(codec.decode_sequence(kind, payload))
                    self.state = "streaming"
                elif first and kind == codec.RESYNC:
                    self._resync(payload)
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
            elif self.state == "snapshot":
                self._snapshot_bytes += len(data)
                if self._snapshot_bytes >= SNAPSHOT_COMMIT_BYTES:
                    self._snapshot_bytes = 0
                    applier.commit()

    def _answer(self, payload):
        size = len(codec.MAGIC) + codec.NONCE_SIZE
        if len(payload) != size or payload[:len(codec.MAGIC)] != codec.MAGIC:
            raise StreamError("the peer is not a brokerd replication leader")
        self._leader_nonce = bytes(payload[len(codec.MAGIC):])
        client, applier = self.client, self.client.applier
        self._position = (applier.epoch, applier.applied_sequence)
        flags = 0 if applier.resumable else codec.NOT_RESUMABLE
        proof = auth.follower_proof(client.secret, self._leader_nonce, self._nonce,
                                    applier.cluster_id, client.node_name, *self._position, flags)
        self.transport.write(codec.frame(codec.AUTH, codec.encode_auth(
            self._nonce, proof, *self._position, flags, applier.cluster_id, client.node_name)))
        self.state = "welcome"

    def _welcomed(self, payload):
        mac, epoch, history, cluster = codec.decode_welcome(payload)
        expected = auth.leader_proof(self.client.secret, self._leader_nonce, self._nonce, cluster,
                                     epoch, history)
        if not auth.same(expected, mac):
            raise StreamError("the leader failed authentication (wrong secret)")
        applier = self.client.applier
        if applier.cluster_id and applier.cluster_id != cluster:
            raise StreamError(f"the leader is of cluster {cluster!r}; this node's data is of"
                              f" cluster {applier.cluster_id!r}")
        applier.adopt(cluster, epoch, history)
        applier.on_durable = self._acknowledge
        applier.on_failure = lambda failure: self._stop(f"commit failed: {failure.value}")
        self.decoder.limit = self.client.max_frame
        self.state, self._first = "streaming", True
        self.log.info("replicating from the leader of cluster {cluster} (epoch {epoch}) after"
                      " operation {sequence} of epoch {old}", cluster=cluster, epoch=epoch,
                      sequence=self._position[1], old=self._position[0])

    def _resync(self, payload):
        reason = bytes(payload).decode("utf-8", "replace")
        self.client.resyncs += 1
        if not self.client.resync:
            return self._stop(f"resync needed: {reason}")
        self.log.warn("the leader asks for a resync ({reason}): wiping this node's replicated"
                      " stores", reason=reason)
        self.state = "wiping"
        wiped = self.client.applier.wipe()
        wiped.addCallbacks(self._wiped, lambda failure: self._stop(
            f"wiping the stores failed: {failure.value}"))

    def _wiped(self, _):
        if self.state == "wiping":
            self.state = "snapshot"
            self._snapshot_bytes = 0
            self.transport.write(codec.frame(codec.READY))

    def _acknowledge(self, sequence):
        if self.state == "streaming":
            self.transport.write(codec.frame(codec.ACK, codec.SEQUENCE.pack(sequence)))
            self.client.acks_sent += 1

    def _refused(self, payload):
        reason = bytes(payload).decode("utf-8", "replace")
        self._stop(f"the leader refused this node: {reason}")

    def _stop(self, reason):
        if self.state == "stopped":
            return
        self.state = "stopped"
        self.client.stopped(reason)
        self.transport.abortConnection()

    def connectionLost(self, reason):
        if self.state in ("hello", "welcome"):
            # A TLS handshake that failed (the leader's certificate not trusted, or not its
            # name) ends here too, its reason in the failure.
            self.client.stopped(f"the connection closed while {self.state} (wrong secret, not"
                                f" a replication port, or TLS refused): {reason.value!r}")
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
        protocol fault, a failed commit, a resync it may not make), or None.
    @ivar resyncs: how many times a leader said this node must resync.
    """

    log = Logger()

    def __init__(self, applier, secret, node_name, *, max_frame=codec.DEFAULT_FRAME_LIMIT,
                 resync=True):
        """
        @param resync: whether a leader's resync may wipe the applier's stores
            and fill them from a snapshot; when False the link stops instead,
            its L{reason} starting with C{"resync needed"}.
        """
        self.applier = applier
        self.secret = secret
        self.node_name = node_name
        self.max_frame = max_frame
        self.resync = resync
        self.resyncs = 0
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
