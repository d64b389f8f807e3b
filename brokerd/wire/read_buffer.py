"""The bytes a connection has read but not parsed yet, for both wire protocols.

A frame that arrives over many TCP reads is gathered as a list of chunks and
joined once it is complete, instead of re-copying the whole buffer on every
read, so a 100 MiB body costs one copy, not thousands. Whole frames left for a
later turn (L{brokerd.wire.fairness}) are kept as the read they came in and an offset
into it, so that parsing a burst a slice at a time copies nothing. The chunks of such a
frame count against the memory watermark (when one is given) until the frame
is complete or dropped: a peer that sends the start of huge frames and never
the rest holds memory like a queue does.

Twisted reads a connection 64 KiB at a time; L{read_in_large_pieces} raises
that to L{READ_SIZE}, so a 64 KiB message comes in one read rather than two
joined, and a burst of small ones in a quarter of the reads.
"""

READ_SIZE = 256 * 1024


def read_in_large_pieces(transport):
    """
    Have the TCP or Unix socket under C{transport} (a TLS one's included) read
    up to L{READ_SIZE} bytes a time.
    """
    while transport is not None:
        # The type's: a TLS wrapper hands unknown names to its protocol.
        if hasattr(type(transport), "bufferSize"):
            transport.bufferSize = READ_SIZE
            return
        transport = getattr(transport, "transport", None)


class ReadBuffer:
    __slots__ = ("_rest", "_rest_at", "_chunks", "_buffered", "_needed", "_watermark")

    def __init__(self, watermark=None):
        # From _rest_at on: whole frames not parsed yet, then the start of one not complete.
        self._rest = b""
        self._rest_at = 0
        self._chunks = None  # the reads of a frame whose size is known
        self._buffered = 0  # bytes in _chunks, all counted in the watermark
        self._needed = 0
        self._watermark = watermark

    @property
    def partial_frame_bytes(self):
        """Bytes held of a frame whose size is known and that is not complete."""
        return self._buffered

    def add(self, data):
        """
        C{(buffer, start)}: the bytes to parse now are C{buffer[start:]}, kept
        bytes first; None while a known-size frame is incomplete.
        """
        if self._needed:
            self._chunks.append(data)
            buffered = self._buffered + len(data)
            if buffered < self._needed:
                self._buffered = buffered
                if self._watermark is not None:
                    self._watermark.add(len(data))
                return None
            data = b"".join(self._chunks)
            self._chunks = None
            self._needed = 0
            self._release()
            return data, 0
        rest = self._rest
        if rest:
            start = self._rest_at
            self._rest, self._rest_at = b"", 0
            if not data:
                return rest, start
            return (rest[start:] if start else rest) + data, 0
        return data, 0

    def keep(self, data, offset, needed=0):
        """Keep C{data[offset:]} for later: the start of a frame that needs
        C{needed} bytes in all (copied, and counted against the watermark), or
        (0) whole frames left for a later turn and the start of one whose
        header is not complete yet (C{data} itself is kept, not a copy)."""
        if needed:
            rest = data[offset:] if offset else data
            self._chunks = [rest]
            self._buffered = len(rest)
            self._needed = needed
            if self._watermark is not None:
                self._watermark.add(self._buffered)
        else:
            self._rest, self._rest_at = data, offset

    def clear(self):
        """Drop everything kept (the connection is closing)."""
        self._release()
        self._rest, self._rest_at = b"", 0
        self._chunks = None
        self._needed = 0

    def _release(self):
        buffered, self._buffered = self._buffered, 0
        if buffered and self._watermark is not None:
            self._watermark.release(buffered)
