"""The end-of-turn write buffer both wire protocols write through.

Frames written during one reactor turn are kept as pieces and handed to the
transport together at the end of the turn (or as soon as the pieces counted by
L{WriteBuffer.send_pieces} or L{WriteBuffer.send_frame} add up to
L{WriteBuffer.FLUSH_BYTES}), so a burst of deliveries or confirms costs one
write, not one per frame. The pieces are joined once and written with
C{transport.write}: memoryview slices are welcome (C{writeSequence} takes only
bytes), the transport's per-piece checks are avoided, and a body is still
copied once (Twisted's send buffer keeps a single joined piece as it is).
While the transport has paused its protocol (the client does not read what we
write), what is written waits in the transport and counts against the memory
watermark until the transport drains. The turns are those of the clock the
buffer is given: the broker's, never a global reactor found on the way.
"""

from struct import Struct

_LENGTH = Struct(">I")


class WriteBuffer:
    """
    The pieces one connection writes during this reactor turn.

    @ivar transport: where the pieces go; set once the connection is made.
    @ivar written_at: the clock's time of the last write to the transport.
    @ivar counted: what counts the bytes written (an object with an int
        C{bytes_sent}, the protocol-free L{brokerd.session.connection.Connection} once
        the client is in), or None while nothing counts them.
    """

    FLUSH_BYTES = 256 * 1024

    __slots__ = (
        "transport", "written_at", "counted", "_clock", "_unsent", "_paused", "_pieces", "_size",
        "_flush_call",
    )

    def __init__(self, clock, unsent):
        """
        @param clock: the C{IReactorTime} whose next turn flushes.
        @param unsent: a L{brokerd.wire.backpressure.HeldBytes} counting what is
            written while the transport has paused us, until it drains; or
            None where nothing is counted (a client).
        """
        self.transport = None
        self.written_at = 0.0
        self.counted = None
        self._clock = clock
        self._unsent = unsent
        self._paused = False
        self._pieces = None  # None while nothing waits (and no flush is scheduled)
        self._size = 0
        self._flush_call = None

    @property
    def idle(self):
        """True while nothing waits for the end of the turn."""
        return self._pieces is None

    def send(self, piece):
        """Queue one piece (a small frame: it is not counted towards L{FLUSH_BYTES})."""
        pieces = self._pieces
        if pieces is None:
            pieces = self._pieces = []
            self._flush_call = self._clock.callLater(0, self.flush)
        pieces.append(piece)

    def send_pieces(self, pieces, size):
        """Queue several pieces (about C{size} bytes); writes at once past L{FLUSH_BYTES}."""
        queued = self._pieces
        if queued is None:
            queued = self._pieces = []
            self._flush_call = self._clock.callLater(0, self.flush)
        queued.extend(pieces)
        self._size += size
        if self._size >= self.FLUSH_BYTES:
            self.flush()

    def send_frame(self, frame):
        """
        Queue C{frame} after its 4-byte big-endian length (native framing);
        counted towards L{FLUSH_BYTES}.
        """
        pieces = self._pieces
        if pieces is None:
            pieces = self._pieces = []
            self._flush_call = self._clock.callLater(0, self.flush)
        pieces.append(_LENGTH.pack(len(frame)))
        pieces.append(frame)
        self._size += len(frame)
        if self._size >= self.FLUSH_BYTES:
            self.flush()

    def flush(self):
        """Write everything queued now."""
        pieces, self._pieces, self._size = self._pieces, None, 0
        call, self._flush_call = self._flush_call, None
        if call is not None and call.active():
            call.cancel()
        if pieces and self.transport is not None:
            data = b"".join(pieces)
            self.transport.write(data)
            self.written_at = self._clock.seconds()
            if self.counted is not None:
                self.counted.bytes_sent += len(data)
            if self._paused and self._unsent is not None:
                self._unsent.add(len(data))  # waits in the transport until the client reads

    def write_now(self, data):
        """
        Write C{data} at once, ahead of the turn's end; only while L{idle}, so
        frames keep their order.
        """
        self.transport.write(data)
        self.written_at = self._clock.seconds()
        if self.counted is not None:
            self.counted.bytes_sent += len(data)

    def flush_and_close(self):
        """Write what is queued, then close the connection once it is sent."""
        self.flush()
        if self.transport is not None:
            self.transport.loseConnection()

    def pause(self):
        """The transport's buffer is full: what is written from now on waits in it."""
        self._paused = True

    def resume(self):
        """The transport wrote everything: what waited in it is released."""
        self._paused = False
        self.release()

    def release(self):
        """The transport is stopping: what waited in it is released."""
        if self._unsent is not None:
            self._unsent.release()

    def connection_lost(self):
        """The connection is gone: nothing more is written, nothing is held."""
        call, self._flush_call = self._flush_call, None
        if call is not None and call.active():
            call.cancel()
        self._pieces = None
        self._size = 0
        self.release()
