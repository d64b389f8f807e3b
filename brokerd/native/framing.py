"""Length-prefixed framing for the native protocol.

L{FrameReceiver} is Twisted's C{Int32StringReceiver} (4-byte big-endian length,
then the frame) with two changes for speed:

  - a frame that arrives in many TCP reads is joined once (L{ReadBuffer}),
    so a 100 MiB body costs one copy, not thousands;
  - frames sent during one reactor turn are handed to the transport together
    at the end of the turn (or as soon as they add up to C{FLUSH_BYTES}), so
    a burst of deliveries or confirms costs one write, not one per frame.

A server sets C{watermark}, so that the chunks of an incomplete frame and the
frames written while its client does not read (the transport has paused us)
count against the memory watermark, and C{read_pauses}, so that no frame is
parsed while reading from its client is paused.
"""

from struct import Struct

from twisted.protocols.basic import Int32StringReceiver

from brokerd.model.watermark import HeldBytes
from brokerd.readbuffer import ReadBuffer

_LENGTH = Struct(">I")
_PREFIX = _LENGTH.size


class FrameReceiver(Int32StringReceiver):
    """Calls C{stringReceived(frame)} per frame; C{MAX_LENGTH} caps a frame (it may change between frames)."""

    MAX_LENGTH = 128 * 1024 * 1024
    _read_buffer = None
    stopped_reading = False  # set when the connection is being closed; later frames are ignored
    watermark = None  # a MemoryWatermark counting partial frames and unread writes, if set
    read_pauses = None  # a ReadingPauses: no frame is parsed while it holds a reason
    writes_paused = False  # True while the transport has paused us (its write buffer is full)
    _unsent = None  # HeldBytes: what was written while writes_paused, until the transport drains

    def dataReceived(self, data):
        read_buffer = self._read_buffer
        if read_buffer is None:
            read_buffer = self._read_buffer = ReadBuffer(self.watermark)
        data = read_buffer.add(data)
        if data is None:
            self.partialFrameReceived()
            return
        offset, size = 0, len(data)
        unpack_from, pauses = _LENGTH.unpack_from, self.read_pauses
        while size - offset >= _PREFIX:
            if self.stopped_reading:
                return
            if self.paused or (pauses is not None and pauses.reasons):
                break  # kept below, parsed when reading resumes
            (length,) = unpack_from(data, offset)
            if length > self.MAX_LENGTH:
                self.stopped_reading = True
                self.lengthLimitExceeded(length)
                return
            end = offset + _PREFIX + length
            if end > size:
                read_buffer.keep(data, offset, _PREFIX + length)
                self.partialFrameReceived()
                return
            self.stringReceived(data[offset + _PREFIX : end])
            offset = end
        if offset < size and not self.stopped_reading:
            read_buffer.keep(data, offset)

    def partialFrameReceived(self):
        """Part of a frame was kept for later (and counted against C{watermark}); a hook for servers."""

    FLUSH_BYTES = 256 * 1024
    clock = None  # an IReactorTime for the end-of-turn flush; the global reactor if None
    _outgoing = None  # frames (with prefixes) waiting for the end of this turn
    _outgoing_bytes = 0
    _flush_call = None

    def sendFrame(self, frame):
        """Queue one frame for writing at the end of this reactor turn."""
        outgoing = self._outgoing
        if outgoing is None:
            outgoing = self._outgoing = []
            clock = self.clock
            if clock is None:
                from twisted.internet import reactor as clock
            self._flush_call = clock.callLater(0, self.flushFrames)
        outgoing.append(_LENGTH.pack(len(frame)))
        outgoing.append(frame)
        self._outgoing_bytes += len(frame)
        if self._outgoing_bytes >= self.FLUSH_BYTES:
            self.flushFrames()

    def flushFrames(self):
        """Write every queued frame now."""
        outgoing, self._outgoing, self._outgoing_bytes = self._outgoing, None, 0
        call, self._flush_call = self._flush_call, None
        if call is not None and call.active():
            call.cancel()
        if outgoing and self.transport is not None:
            self.transport.writeSequence(outgoing)
            if self.writes_paused and self.watermark is not None:
                self._count_unsent(outgoing)

    def _count_unsent(self, outgoing):
        """Frames written while the client does not read wait in the transport: count them until it drains."""
        if self._unsent is None:
            self._unsent = HeldBytes(self.watermark)
        self._unsent.add(sum(map(len, outgoing)))

    def release_unsent(self):
        """The transport has written everything (or is gone): what waited in it is released."""
        if self._unsent is not None:
            self._unsent.release()

    def closeAfterFlush(self):
        """Write what is queued, then close the connection once it is sent."""
        self.flushFrames()
        self.transport.loseConnection()

    def connectionLost(self, reason):
        call, self._flush_call = self._flush_call, None
        if call is not None and call.active():
            call.cancel()
        self._outgoing = None
        if self._read_buffer is not None:
            self._read_buffer.clear()
        self.release_unsent()
