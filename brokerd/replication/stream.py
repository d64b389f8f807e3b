"""The leader's outbound stream: every store operation, numbered, kept encoded for a while."""

from array import array
from bisect import bisect_right
from itertools import repeat

from brokerd.proto import replication_pb2
from brokerd.replication import codec

_ACCESS_RECORD = replication_pb2.ReplicatedOperation().SerializeToString()

# The most bytes of frames one segment holds (a bigger frame gets a segment of its own).
SEGMENT_BYTES = 1024 * 1024
# Bodies an append run takes before it is closed (it may pass this by one body).
RUN_BYTES = 64 * 1024


class _Run:
    """Appends alike not yet written: their record, the first one's sequence, their bodies."""

    __slots__ = ("record", "first", "bodies", "size")

    def __init__(self, record, first):
        self.record = record
        self.first = first
        self.bodies = []
        self.size = 0


class _Segment:
    """
    Frames written one after another into one buffer, that is never resized nor reused;
    written and read through a memoryview (slice assignment to one costs half what it
    costs to a bytearray).
    """

    __slots__ = ("start", "first", "view", "size", "fill")

    def __init__(self, start, first, size):
        self.start = start  # the stream position of its first byte
        self.first = first  # the sequence of its first frame
        self.view = memoryview(bytearray(size))
        self.size = size
        self.fill = 0


class OutboundStream:
    """
    The operations of every tapped store of a leader, numbered from 1 in the
    order they were made, each kept as the frame that carries it.

    Frames are written once, when recorded, one after another into segments
    (buffers of up to L{SEGMENT_BYTES}); a follower that lacks a run of them is
    sent the run as one slice (L{frames_from}). So recording an operation makes
    no object the cyclic collector must walk, and sending it costs nothing per
    frame.

    Appends alike (the same record) made one after another travel as one
    frame (L{codec.APPEND_RUN}): L{record_append} keeps them in an open run,
    written at the end of the turn, before any other operation, or once it
    holds L{RUN_BYTES}. A sequence inside a run starts no frame.

    With a C{reactor}, listeners hear of new operations once per reactor turn
    (called with the newest sequence after the turn's operations), so that a
    turn's operations reach each follower in one write rather than one write
    each; without one, after each operation. Where every tapped store says when
    its commits start (L{add_tap}), they hear as each commit starts instead:
    the followers get at once what the leader's commit will cover (which is
    what its confirms wait for), in one write per commit rather than per turn,
    and commit it while the leader does. Either way they hear of every
    operation before it can be dropped (see below).

    Only the latest C{retain_bytes} of frames are kept (at least the newest
    segment), dropped a segment at a time, oldest first, so a follower that
    falls further behind cannot make the leader hold more: it must catch up
    another way.

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
        # Small caps get small segments, so that they drop a little at a time.
        self._segment_bytes = max(1, min(SEGMENT_BYTES, retain_bytes // 16))
        self._segments = []  # kept, oldest first
        self._starts = []  # each kept segment's start, for bisecting
        self._current = None  # the segment frames are written into
        self._ends = array("q")  # the stream position after each kept frame ...
        self._ends_head = 0  # ... from this index on (those before it are dropped)
        self._first = last_sequence + 1  # the sequence of the oldest kept frame
        self._kept_from = 0  # the stream position of the oldest kept frame
        self._total = 0  # stream bytes recorded
        self._pins = {}  # token -> the first sequence it keeps
        self._listeners = []
        self._reactor = reactor
        self._announcing = None  # the reactor call that announces this turn's operations
        self._sent = (0, 0, b"")  # the last run L{frames_from} gave: (first, next, bytes)
        self._run = None  # the open run of appends alike
        self._written = last_sequence  # the newest sequence written into a segment
        self._turn_taps = 0  # taps of stores that do not say when their commits start
        self._per_turn = reactor is not None  # announced at each turn's end

    def add_tap(self, name, tap, commit_starts):
        """
        Record the operations of C{tap} (the L{StoreTap} of store C{name}) too;
        C{commit_starts} says whether its store tells C{commit_starting} when its
        commits start (else announcements stay once per turn for every store).
        """
        self.taps[name] = tap
        self._turn_taps += not commit_starts
        self._per_turn = self._reactor is not None and self._turn_taps > 0

    def commit_starting(self):
        """A tapped store's commit starts: announce what it (and the others) will cover."""
        if self._run is not None or self.last_sequence != self.announced:
            self.announce()

    def record(self, operation, record, body=b""):
        """Number and keep one operation (a code of L{codec} and its serialised record)."""
        if self._run is not None:
            self._close_run()
        sequence = self.last_sequence = self._write(operation, record, body)
        self._announce_soon()
        return sequence

    def record_append(self, record, body):
        """
        Number and keep one append, C{record} its serialised record: the same bytes object
        for appends alike, which then share one frame (see above).
        """
        run = self._run
        if run is None or run.record is not record or run.size > RUN_BYTES:
            if run is not None:
                self._close_run()
            run = self._run = _Run(record, self.last_sequence + 1)
        run.bodies.append(body)
        run.size += len(body)
        sequence = self.last_sequence = self.last_sequence + 1
        self._announce_soon()
        return sequence

    def cut(self):
        """
        End the open run of appends, so that the next operation starts a frame (a
        snapshot's position must be where a follower can be sent from); returns the
        newest sequence.
        """
        self._close_run()
        return self.last_sequence

    def _announce_soon(self):
        if self._reactor is None:
            self.announce()
        elif self._per_turn and self._announcing is None:
            self._announcing = self._reactor.callLater(0, self.announce)

    def _close_run(self):
        """Write the open run (if any) as one frame: an append's own when it holds one."""
        run, self._run = self._run, None
        if run is None:
            return
        bodies = run.bodies
        if len(bodies) == 1:
            self._write(codec.APPEND, run.record, bodies[0])
            return
        size = codec.OPERATION_FRAME_OVERHEAD + len(run.record) + codec.run_size(bodies, run.size)
        segment = self._segment_for(size)
        segment.fill = codec.pack_run_into(segment.view, segment.fill, self._written + 1,
                                           run.record, bodies, run.size)
        self._wrote(size, len(bodies))

    def _write(self, operation, record, body):
        """Write one operation's frame into a segment; returns its sequence."""
        size = codec.OPERATION_FRAME_OVERHEAD + len(record) + len(body)
        segment = self._segment_for(size)
        sequence = self._written + 1
        segment.fill = codec.pack_operation_into(segment.view, segment.fill, sequence, operation,
                                                 record, body)
        self._wrote(size, 1)
        return sequence

    def _segment_for(self, size):
        """The segment the next frame, of C{size} bytes, goes into."""
        segment = self._current
        if segment is None or segment.fill + size > segment.size:
            segment = self._current = _Segment(self._total, self._written + 1,
                                               max(size, self._segment_bytes))
            self._segments.append(segment)
            self._starts.append(segment.start)
        return segment

    def _wrote(self, size, count):
        """A frame of C{size} bytes and C{count} operations was written: keep its end."""
        self._written += count
        self._total += size
        if count == 1:
            self._ends.append(self._total)
        else:
            self._ends.extend(repeat(self._total, count))
        if self._total - self._kept_from > self.retain_bytes:
            self._trim(self._written)

    def _trim(self, sequence):
        """Drop the oldest segments past C{retain_bytes}, announcing the unannounced first."""
        floor = min(min(self._pins.values(), default=sequence), sequence)
        segments = self._segments
        while len(segments) > 1 and self._total - self._kept_from > self.retain_bytes:
            following = segments[1]
            if following.first > floor:
                break  # the oldest segment holds a pinned frame
            if following.first - 1 > self.announced:
                self.announce()  # followers get what they lack before it can go
            del segments[0], self._starts[0]
            self._ends_head += following.first - self._first
            self._first, self._kept_from = following.first, following.start
        if self._ends_head > 4096 and self._ends_head * 2 > len(self._ends):
            del self._ends[:self._ends_head]
            self._ends_head = 0

    def announce(self):
        """Tell the listeners of the operations recorded since the last announcement."""
        if self._announcing is not None:
            if self._announcing.active():
                self._announcing.cancel()
            self._announcing = None
        self._close_run()
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
        self._close_run()
        return self._total - self._kept_from

    def frame(self, sequence):
        """C{(parts, size)} of the kept frame starting at C{sequence}; KeyError when none is."""
        start, end = self._span(sequence)
        data = self._bytes(start, end)
        return (data,), len(data)

    def frames_from(self, sequence, limit):
        """
        C{(bytes, next sequence)}: the kept frames from C{sequence} on, as many as fit in
        C{limit} bytes (at least one) and lie in one segment, joined; KeyError when
        C{sequence} is not kept. Asked twice for the same run (two followers at the same
        place), it gives the same bytes without copying them again.
        """
        self._close_run()
        first, following, data = self._sent
        if first == sequence and following == self.last_sequence + 1:
            return data, following
        start, end = self._span(sequence)
        segment = self._segments[bisect_right(self._starts, start) - 1]
        bound = min(segment.start + segment.fill, start + limit)
        ends, index = self._ends, self._ends_head + sequence - self._first
        last = bisect_right(ends, bound, index, len(ends)) - 1
        if last > index:
            end = ends[last]
        following = sequence + max(last - index, 0) + 1
        data = self._bytes(start, end)
        self._sent = (sequence, following, data)
        return data, following

    def _span(self, sequence):
        """The stream positions of the kept frame starting at C{sequence}."""
        self._close_run()
        if not self._first <= sequence <= self.last_sequence:
            raise KeyError(sequence)
        index = self._ends_head + sequence - self._first
        start = self._ends[index - 1] if sequence > self._first else self._kept_from
        end = self._ends[index]
        if start == end:
            raise KeyError(sequence)  # inside a run
        return start, end

    def _bytes(self, start, end):
        segment = self._segments[bisect_right(self._starts, start) - 1]
        at = start - segment.start
        return bytes(segment.view[at:at + end - start])

    def bytes_after(self, sequence):
        """
        How many bytes of frames follow operation C{sequence} (a follower's lag
        in bytes), counted over the kept frames when C{sequence} is older.
        """
        self._close_run()
        if sequence >= self.last_sequence:
            return 0
        if self._first > self.last_sequence:
            return 0  # nothing kept: a promoted leader's stream before its first operation
        if sequence < self._first:
            return self._total - self._kept_from
        return self._total - self._ends[self._ends_head + sequence - self._first]

    def subscribe(self, listener):
        self._listeners.append(listener)

    def unsubscribe(self, listener):
        if listener in self._listeners:
            self._listeners.remove(listener)
