"""The leader's end of one follower's replication link: handshake, resume or snapshot, stream."""

from twisted.internet import protocol
from twisted.logger import Logger

from brokerd.replication import auth, codec, resume
from brokerd.replication.codec import StreamError
from brokerd.replication.snapshot import Snapshot

# A snapshot sends at most this much in one reactor turn, then lets the others run.
SNAPSHOT_TURN_BYTES = 256 * 1024
PUSH_BATCH_BYTES = 256 * 1024
SNAPSHOT_TURN_FRAMES = 256


class FollowerLink(protocol.Protocol):
    """
    One follower's connection on the leader. Before the follower has proved
    it holds the secret it gets nothing but a challenge: anything else it
    sends, a wrong answer, or silence past the handshake timeout, is logged
    and the connection dropped. Then it either resumes (receives the stream
    from the operation after its position) or is told to resync: once it says
    its stores are wiped it receives a L{Snapshot}, then the stream after the
    snapshot's position. Frames are written only while the transport accepts
    more (the link is the transport's streaming producer), so a slow follower
    stalls its own link, not the leader's memory.

    @ivar acked: the highest sequence the follower's durable commit covers.
    @ivar in_sync: whether it counts for L{ReplicationServer.confirmed_up_to}:
        set once it has acked everything streamed, cleared when its lag
        passes the server's C{max_lag_bytes}.
    @ivar mode: C{"handshake"}, C{"resync"} (told to, awaiting its wipe),
        C{"snapshot"} or C{"stream"}.
    """

    log = Logger()

    def __init__(self, server):
        self.server = server
        self.decoder = codec.FrameDecoder(codec.HANDSHAKE_FRAME_LIMIT)
        self.node = None
        self.acked = 0
        self.next = 1  # the next sequence to write
        self.in_sync = False
        self.paused = False
        self.pauses = 0
        self.bytes_written = 0
        self.mode = "handshake"
        self.snapshot = None
        self._nonce = auth.nonce()
        self._streaming = False
        self._closing = False
        self._producing = False
        self._timeout = None
        self._continue = None

    def connectionMade(self):
        self.peer = str(self.transport.getPeer())
        self._timeout = self.server.reactor.callLater(
            self.server.handshake_timeout, self._drop, "no answer to the challenge in time")
        self.transport.write(codec.frame(codec.HELLO, codec.MAGIC + self._nonce))

    def dataReceived(self, data):
        try:
            for kind, payload in self.decoder.feed(data):
                if self.mode == "handshake":
                    self._authenticate(kind, payload)
                elif kind == codec.READY and self.mode == "resync":
                    self._start_snapshot()
                elif kind == codec.ACK and self.mode == "stream":
                    self._received_ack(codec.decode_sequence(kind, payload))
                else:
                    raise StreamError(f"sent a {codec.KINDS[kind]} frame of {len(payload)} bytes"
                                      f" while {self.mode}")
                if self._closing:
                    return
        except StreamError as problem:
            self._drop(str(problem))

    def _authenticate(self, kind, payload):
        if kind != codec.AUTH:
            raise StreamError(f"sent a {codec.KINDS[kind]} frame before authenticating")
        follower_nonce, mac, epoch, sequence, flags, cluster, node = codec.decode_auth(payload)
        server = self.server
        expected = auth.follower_proof(server.secret, self._nonce, follower_nonce, cluster, node,
                                       epoch, sequence, flags)
        if not auth.same(expected, mac):
            raise StreamError("failed authentication (wrong secret, or not a brokerd follower)")
        self._cancel_timeout()
        self.node = node
        if cluster and cluster != server.cluster_id:
            return self._refuse(f"follower {node!r} holds data of cluster {cluster!r},"
                                f" not of this cluster {server.cluster_id!r}")
        server.replace(self)
        self.transport.write(codec.frame(codec.WELCOME, codec.encode_welcome(
            auth.leader_proof(server.secret, self._nonce, follower_nonce, server.cluster_id,
                              server.epoch, server.history),
            server.epoch, server.history, server.cluster_id)))
        reason = resume.resync_reason(server.stream, server.epoch, server.history, epoch,
                                      sequence, flags)
        self.transport.registerProducer(self, True)
        self._streaming = True
        server.joined(self)
        if reason is not None:
            self.mode = "resync"
            server.resynced(self, reason)
            self.transport.write(codec.frame(codec.RESYNC, reason.encode("utf-8")))
            return
        self.mode, self.acked, self.next = "stream", sequence, sequence + 1
        self.log.info("replication follower {node} ({peer}) resumes at operation {sequence} of"
                      " epoch {epoch}", node=node, peer=self.peer, sequence=sequence, epoch=epoch)
        server.acked(self)
        self.push()

    def _start_snapshot(self):
        self.snapshot = Snapshot(self.server.stream, self.server.access_document)
        self.mode, self.next = "snapshot", self.snapshot.position + 1
        self.decoder.limit = 64  # acks only from here on
        self.log.info("replication follower {node} gets a snapshot at operation {position}",
                      node=self.node, position=self.snapshot.position)
        self.push()

    def _received_ack(self, sequence):
        if not self.acked <= sequence < self.next:
            raise StreamError(f"acked operation {sequence}, outside {self.acked} to"
                              f" {self.next - 1}")
        self.acked = sequence
        self.server.acked(self)

    def push(self, _sequence=None):
        """Write what the follower lacks while the transport takes it."""
        if self.mode not in ("snapshot", "stream") or self._producing:
            return  # not yet; or called back while the snapshot reads (it goes on after)
        if self.snapshot is not None:
            if not self._push_snapshot():
                return
        stream = self.server.stream
        while self._streaming and not self.paused and self.next <= stream.last_sequence:
            try:
                data, following = stream.frames_from(self.next, PUSH_BATCH_BYTES)
            except KeyError:
                return self._refuse(f"follower {self.node!r} fell behind the operations the"
                                    f" leader keeps (at {self.next}, kept from"
                                    f" {stream.first_retained}): it needs a snapshot")
            self.next = following
            self.transport.write(data)
            self.bytes_written += len(data)
        if self._streaming and self.mode == "stream":
            self.server.check_lag(self)

    def _push_snapshot(self):
        """Send a turn's worth of the snapshot; True once it is all sent."""
        written = frames = 0
        while self._streaming and not self.paused and self._continue is None:
            if written >= SNAPSHOT_TURN_BYTES or frames >= SNAPSHOT_TURN_FRAMES:
                self._continue = self.server.reactor.callLater(0, self._resume_snapshot)
                return False
            try:
                self._producing = True
                parts = self.snapshot.next()
            except Exception as problem:  # a store that cannot read back what it holds
                self.log.failure("snapshot for {node} failed", node=self.node)
                self._drop(f"the snapshot could not be read: {problem!r}")
                return False
            finally:
                self._producing = False
                if not self._streaming and self.snapshot is not None:
                    self._stop_streaming()  # stopped while the snapshot was reading
            if not self._streaming:
                return False
            if parts is None:
                self._end_snapshot()
                return True
            if not isinstance(parts, tuple):  # a Deferred: a body or a window being read
                if parts.called:
                    continue  # read at once: its result goes into the next step
                self._continue = parts
                parts.addBoth(lambda _: self._resume_snapshot())
                return False
            self.transport.writeSequence(parts)
            size = sum(len(part) for part in parts)
            self.bytes_written += size
            written += size
            frames += 1
        return False

    def _resume_snapshot(self):
        self._continue = None
        if self._streaming:
            self.push()

    def _end_snapshot(self):
        snapshot, self.snapshot = self.snapshot, None
        snapshot.close()
        self.mode = "stream"
        self.log.info("replication follower {node} has the snapshot ({messages} messages,"
                      " {skipped} gone by their turn)", node=self.node,
                      messages=snapshot.messages, skipped=snapshot.skipped)

    def lag(self):
        """C{(operations, bytes)} the follower's durable commits are behind the leader."""
        stream = self.server.stream
        return stream.last_sequence - self.acked, stream.bytes_after(self.acked)

    def pauseProducing(self):
        self.paused = True
        self.pauses += 1

    def resumeProducing(self):
        self.paused = False
        self.push()

    def stopProducing(self):
        self._stop_streaming()

    def _stop_streaming(self):
        self._streaming = False
        waiting, self._continue = self._continue, None
        if waiting is not None and hasattr(waiting, "active") and waiting.active():
            waiting.cancel()  # the next turn of a snapshot (a Deferred read just ends unused)
        if self.snapshot is not None and not self._producing:
            snapshot, self.snapshot = self.snapshot, None
            snapshot.close()

    def _refuse(self, reason):
        self._closing = True
        self.server.refused(self.peer, reason)
        self._stop_streaming()
        self.transport.write(codec.frame(codec.REFUSE, reason.encode("utf-8")))
        self.transport.loseConnection()

    def _drop(self, reason):
        if self._closing:
            return
        self._closing = True
        self._cancel_timeout()
        self.server.refused(self.peer, reason)
        self._stop_streaming()
        self.transport.abortConnection()

    def replaced(self):
        """A newer link of the same node name took this one's place."""
        self._drop(f"follower {self.node!r} connected again: this older link is replaced")

    def _cancel_timeout(self):
        if self._timeout is not None and self._timeout.active():
            self._timeout.cancel()
        self._timeout = None

    def connectionLost(self, reason):
        self._cancel_timeout()
        self._stop_streaming()
        self.server.left(self)
