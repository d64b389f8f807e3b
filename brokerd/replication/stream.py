"""The leader's outbound stream: every store operation, numbered, kept encoded for a while."""

from brokerd.replication import codec


class OutboundStream:
    """
    The operations of every tapped store of a leader, numbered from 1 in the
    order they were made, each kept as the frame that carries it.

    Only the latest C{retain_bytes} of frames are kept (at least the newest
    one), so a follower that falls further behind cannot make the leader
    hold more: it must catch up another way. Listeners are called with the
    new sequence number after each operation is recorded.

    @ivar last_sequence: the number of the newest operation, 0 before any.
    """

    def __init__(self, retain_bytes=64 * 1024 * 1024):
        self.retain_bytes = retain_bytes
        self.last_sequence = 0
        self._frames = []  # (parts, size, total bytes streamed up to and including it)
        self._head = 0  # index in _frames of the oldest retained frame
        self._first = 1  # its sequence
        self._retained = 0
        self._total = 0
        self._listeners = []

    def record(self, operation, record, body=b""):
        """Number and keep one operation (a code of L{codec} and its serialised record)."""
        sequence = self.last_sequence + 1
        parts = codec.operation_parts(sequence, operation, record, body)
        size = sum(len(part) for part in parts)
        self.last_sequence = sequence
        self._total += size
        self._frames.append((parts, size, self._total))
        self._retained += size
        while self._retained > self.retain_bytes and self._first < sequence:
            self._retained -= self._frames[self._head][1]
            self._frames[self._head] = None
            self._head += 1
            self._first += 1
        if self._head > 1024 and self._head * 2 > len(self._frames):
            del self._frames[:self._head]
            self._head = 0
        for listener in tuple(self._listeners):
            listener(sequence)
        return sequence

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
        if sequence < self._first:
            return self._total - (self._frames[self._head][2] - self._frames[self._head][1])
        return self._total - self._frames[self._head + sequence - self._first][2]

    def subscribe(self, listener):
        self._listeners.append(listener)

    def unsubscribe(self, listener):
        if listener in self._listeners:
            self._listeners.remove(listener)
