"""Length-prefixed framing for the native protocol.

L{FrameReceiver} is Twisted's C{Int32StringReceiver} (4-byte big-endian length,
then the frame) with two changes for speed:

  - a frame that arrives in many TCP reads is joined once (L{ReadBuffer}),
    so a 100 MiB body costs one copy, not thousands;
  - frames sent during one reactor turn are handed to the transport together
    at the end of the turn (or as soon as they add up to C{FLUSH_BYTES}), so
    a burst of deliveries or confirms costs one write, not one per frame.
"""

from struct import Struct

from twisted.protocols.basic import Int32StringReceiver

from brokerd.readbuffer import ReadBuffer

_LENGTH = Struct(">I")
_PREFIX = _LENGTH.size


class FrameReceiver(Int32StringReceiver):
    """Calls C{stringReceived(frame)} per frame; C{MAX_LENGTH} caps a frame."""

    MAX_LENGTH = 128 * 1024 * 1024
    _read_buffer = None
    stopped_reading = False  # set when the connection is being closed; later frames are ignored

    def dataReceived(self, data):
        read_buffer = self._read_buffer
        if read_buffer is None:
            read_buffer = self._read_buffer = ReadBuffer()
        data = read_buffer.add(data)
        if data is None:
            return
        offset, size = 0, len(data)
        unpack_from, max_length = _LENGTH.unpack_from, self.MAX_LENGTH
        while size - offset >= _PREFIX and not self.paused:
            if self.stopped_reading:
                return
            (length,) = unpack_from(data, offset)
            if length > max_length:
                self.stopped_reading = True
                self.lengthLimitExceeded(length)
                return
            end = offset + _PREFIX + length
            if end > size:
                read_buffer.keep(data, offset, _PREFIX + length)
                return
            self.stringReceived(data[offset + _PREFIX : end])
            offset = end
        if offset < size and not self.stopped_reading:
            read_buffer.keep(data, offset)

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

    def closeAfterFlush(self):
        """Write what is queued, then close the connection once it is sent."""
        self.flushFrames()
        self.transport.loseConnection()

    def connectionLost(self, reason):
        call, self._flush_call = self._flush_call, None
        if call is not None and call.active():
            call.cancel()
        self._outgoing = None
