"""The leader's outbound stream: every store operation, numbered, kept encoded for a while."""

from brokerd.proto import replication_pb2
from brokerd.replication import codec

_ACCESS_RECORD = replication_pb2.ReplicatedOperation().SerializeToString()


class OutboundStream:
    """
    The operations of every tapped store of a leader, numbered from 1 in the
    order they were made, each kept as the frame that carries it.

    With a C{reactor}, listeners hear of new operations once per reactor turn
    (called with the newest sequence after the turn's operations), so that a
    turn's operations reach each follower in one write rather than one write
    each; without one, after each operation. Either way they hear of every
    operation before it can be dropped (see below).

    Only the latest C{retain_bytes} of frames are kept (at least the newest
    one), so a follower that falls further behind cannot make the leader
    hold more: it must catch up another way. Listeners are called with the
    new sequence number after each operation is recorded.

    A leader promoted from a follower continues the numbering of the stream
    it followed (C{last_sequence}). A snapshot in progress pins the
    operations after its position (L{pin}), which are kept whatever their size
    until it ends. Operations not yet announced to the listeners are announced
    at once when keeping them would pass C{retain_bytes}, before any is dropped.

    @ivar last_sequence: the number of the newest operation (C{last_sequence}
        given, 0 by default, before any).
    @ivar taps: the L{StoreTap}s recording into this stream, by store name.
    """

    def __init__(self, retain_bytes=64 * 1024 * 1024, *, last_sequence=0, reactor=None):
        self.retain_bytes = retain_bytes
        self.last_sequence = last_sequence
        self.announced = last_sequence  # the newest sequence the listeners have heard of
        self.taps = {}
        self._frames = []  # (parts, size, total bytes streamed up to and including it)
        self._head = 0  # index in _frames of the oldest retained frame
        self._first = last_sequence + 1  # its sequence
        self._pins = {}  # token -> the first sequence it keeps
        self._retained = 0
        self._total = 0
        self._listeners = []
        self._reactor = reactor
        self._announcing = None  # the reactor call that announces this turn's operations

    def record(self, operation, record, body=b""):
        """Number and keep one operation (a code of L{codec} and its serialised record)."""
        sequence = self.last_sequence + 1
        parts = codec.operation_parts(sequence, operation, record, body)
        size = len(parts[0]) + len(body)
        self.last_sequence = sequence
        self._total += size
        self._frames.append((parts, size, self._total))
        self._retained += size
        if self._retained > self.retain_bytes:
            self._trim(sequence)
        if self._reactor is None:
            self.announce()
        elif self._announcing is None:
            self._announcing = self._reactor.callLater(0, self.announce)
        return sequence

    def _trim(self, sequence):
        """Drop the oldest frames past C{retain_bytes}, announcing the unannounced first."""
        floor = min(self._pins.values(), default=sequence)
        while self._retained > self.retain_bytes and self._first < min(sequence, floor):
            if self._first > self.announced:
                self.announce()  # followers get what they lack before it can go
            self._retained -= self._frames[self._head][1]
            self._frames[self._head] = None
            self._head += 1
            self._first += 1
        if self._head > 1024 and self._head * 2 > len(self._frames):
            del self._frames[:self._head]
            self._head = 0

    def announce(self):
        """Tell the listeners of the operations recorded since the last announcement."""
        if self._announcing is not None:
            if self._announcing.active():
                self._announcing.cancel()
            self._announcing = None
        sequence = self.last_sequence
        if sequence == self.announced:
            return
        self.announced = sequence
        for listener in tuple(self._listeners):
            listener(sequence)

    def record_access_document(self, document):
        """
        Record the leader's access database (its JSON document, as bytes):
        followers hand it to their C{access_sink} in sequence order.
        """
        return self.record(codec.ACCESS_DOCUMENT, _ACCESS_RECORD, bytes(document))

    def pin(self, sequence):
        """Keep every operation from C{sequence} on until L{unpin}; returns a token for it."""
        token = object()
        self._pins[token] = max(sequence, self._first)
        return token

    def unpin(self, token):
        self._pins.pop(token, None)

    @property
    def first_retained(self):
        """The sequence of the oldest operation still kept (last_sequence + 1 when none is)."""
        return self._first

    def retained_bytes(self):
        """How many bytes of frames are kept."""
        return self._retained

    def frame(self, sequence):
        """C{(parts, size)} of the kept operation C{sequence}; KeyError when not kept."""
        if not self._first <= sequence <= self.last_sequence:
            raise KeyError(sequence)
        parts, size, _ = self._frames[self._head + sequence - self._first]
        return parts, size

    def bytes_after(self, sequence):
        """
        How many bytes of frames follow operation C{sequence} (a follower's lag
        in bytes), counted over the kept frames when C{sequence} is older.
        """
        if sequence >= self.last_sequence:
            return 0
        if self._first > self.last_sequence:
            return 0  # nothing kept: a promoted leader's stream before its first operation
        if sequence < self._first:
            return self._total - (self._frames[self._head][2] - self._frames[self._head][1])
        return self._total - self._frames[self._head + sequence - self._first][2]

    def subscribe(self, listener):
        self._listeners.append(listener)

    def unsubscribe(self, listener):
        if listener in self._listeners:
            self._listeners.remove(listener)
