"""Length-prefixed framing for the native protocol.

L{FrameReceiver} is Twisted's C{Int32StringReceiver} (4-byte big-endian length,
then the frame) with two changes for speed:

  - a frame that arrives in many TCP reads is joined once (L{ReadBuffer}),
    so a 100 MiB body costs one copy, not thousands;
  - frames sent during one reactor turn are handed to the transport together
    at the end of the turn by the L{WriteBuffer} the AMQP server uses too, so
    a burst of deliveries or confirms costs one write, not one per frame.

The clock those turns are counted on is given to the receiver (the broker's
for a server, the reactor the client connects with). A server also gives its
C{watermark}, so that the chunks of an incomplete frame and the frames written
while its client does not read (the transport has paused us) count against the
memory watermark, and sets C{read_pauses}, so that no frame is parsed while
reading from its client is paused and a burst of frames is parsed a turn's
worth at a time (L{brokerd.wire.fairness}).
"""

from struct import Struct

from twisted.protocols.basic import Int32StringReceiver

from brokerd.wire import fairness
from brokerd.wire.backpressure import HeldBytes
from brokerd.wire.fairness import FRAMES_PER_CHECK, TurnTaking
from brokerd.wire.read_buffer import ReadBuffer
from brokerd.wire.write_buffer import WriteBuffer

PROTOCOL_VERSION = 1  # what hello and hello-ok carry; a client of another version is refused
_LENGTH = Struct(">I")
_PREFIX = _LENGTH.size


class FrameReceiver(Int32StringReceiver):
    """
    Calls C{stringReceived(frame)} per frame; C{MAX_LENGTH} caps a frame (it may
    change between frames).

    @ivar writes: the connection's L{WriteBuffer}.
    @ivar sendFrame: queues one frame (its length, then it) for writing at
        the end of this reactor turn: the buffer's C{send_frame} itself, so
        that sending a frame costs one call, as it did before the buffer was shared.
    """

    MAX_LENGTH = 128 * 1024 * 1024
    _read_buffer = None
    stopped_reading = False  # set when the connection is being closed; later frames are ignored
    read_pauses = None  # a ReadingPauses: no frame is parsed while it holds a reason
    _turns = None  # a server's TurnTaking, made on its first read
    # What partial frames count against, if not the watermark: a server's account of what the
    # connection holds (brokerd.wire.connection_memory), which counts them there too.
    inbound = None

    def __init__(self, clock, watermark=None):
        """
        @param clock: the C{IReactorTime} whose turns the writes wait for.
        @param watermark: a L{MemoryWatermark} counting partial frames and the
            frames written while the client does not read, if given.
        """
        self.clock = clock
        self.watermark = watermark
        self.writes = WriteBuffer(clock, HeldBytes(watermark) if watermark is not None else None)
        self.sendFrame = self.writes.send_frame

    def makeConnection(self, transport):
        self.writes.transport = transport
        Int32StringReceiver.makeConnection(self, transport)

    def dataReceived(self, data):
        read_buffer = self._read_buffer
        if read_buffer is None:
            inbound = self.watermark if self.inbound is None else self.inbound
            read_buffer = self._read_buffer = ReadBuffer(inbound)
        kept = read_buffer.add(data)
        if kept is None:
            self.partialFrameReceived()
            return
        data, offset = kept
        size = len(data)
        unpack_from, pauses = _LENGTH.unpack_from, self.read_pauses
        until_check, deadline = -1, 0.0  # a client parses all it reads
        if pauses is not None:  # a server takes turns with its other connections
            taking = self._turns
            if taking is None:
                taking = self._turns = TurnTaking(self.clock, pauses, self._parse_held)
            until_check, deadline = FRAMES_PER_CHECK, taking.deadline()
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
            until_check -= 1
            if not until_check:
                until_check = fairness.frames_until_check(deadline)
                if not until_check:
                    break  # the turn is over
        if offset < size and not self.stopped_reading:
            read_buffer.keep(data, offset)
            if not until_check and not pauses.reasons:
                self._turns.end_turn()

    def _parse_held(self):
        """
        Parse the frames kept for this turn, unless reading stopped meanwhile
        (a pause, a close).
        """
        if not self.stopped_reading and not self.read_pauses.reasons:
            self.dataReceived(b"")

    def partialFrameReceived(self):
        """
        Part of a frame was kept for later (and counted against C{watermark});
        a hook for servers.
        """

    def closeAfterFlush(self):
        """Write what is queued, then close the connection once it is sent."""
        self.writes.flush_and_close()

    def connectionLost(self, reason):
        self.writes.connection_lost()
        if self._turns is not None:
            self._turns.stop()
        if self._read_buffer is not None:
            self._read_buffer.clear()
