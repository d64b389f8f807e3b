"""Length-prefixed framing for the native protocol.

L{FrameReceiver} is Twisted's C{Int32StringReceiver} (4-byte big-endian length,
then the frame) with one change: a frame that arrives in many TCP reads is
gathered as a list of chunks and joined once, instead of re-copying the whole
buffer on every read, so a 100 MiB body costs one copy, not thousands.
"""

from struct import Struct

from twisted.protocols.basic import Int32StringReceiver

_LENGTH = Struct(">I")
_PREFIX = _LENGTH.size


class FrameReceiver(Int32StringReceiver):
    """Calls C{stringReceived(frame)} per frame; C{MAX_LENGTH} caps a frame."""

    MAX_LENGTH = 128 * 1024 * 1024
    _unprocessed = b""
    _waiting_for = 0  # bytes needed to complete a frame that spans reads
    _chunks = None
    _buffered = 0
    stopped_reading = False  # set when the connection is being closed; later frames are ignored

    def dataReceived(self, data):
        if self._waiting_for:
            self._chunks.append(data)
            self._buffered += len(data)
            if self._buffered < self._waiting_for:
                return
            data = b"".join(self._chunks)
            self._chunks = None
            self._waiting_for = self._buffered = 0
        elif self._unprocessed:
            data = self._unprocessed + data
            self._unprocessed = b""
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
                self._chunks = [data[offset:] if offset else data]
                self._buffered = size - offset
                self._waiting_for = _PREFIX + length
                return
            self.stringReceived(data[offset + _PREFIX : end])
            offset = end
        if offset < size and not self.stopped_reading:
            self._unprocessed = data[offset:] if offset else data

    def sendFrame(self, frame):
        """Write one frame; the same as C{sendString}, without its length check."""
        self.transport.writeSequence((_LENGTH.pack(len(frame)), frame))
