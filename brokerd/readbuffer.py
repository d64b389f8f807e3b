"""The bytes a connection has read but not parsed yet, for both wire protocols.

A frame that arrives over many TCP reads is gathered as a list of chunks and
joined once it is complete, instead of re-copying the whole buffer on every
read, so a 100 MiB body costs one copy, not thousands.
"""


class ReadBuffer:
    __slots__ = ("_rest", "_chunks", "_buffered", "_needed")

    def __init__(self):
        self._rest = b""  # the start of a frame whose size is not known yet
        self._chunks = None  # the reads of a frame whose size is known
        self._buffered = 0
        self._needed = 0

    def add(self, data):
        """The bytes to parse now, kept bytes first; None while a known-size frame is incomplete."""
        if self._needed:
            self._chunks.append(data)
            self._buffered += len(data)
            if self._buffered < self._needed:
                return None
            data = b"".join(self._chunks)
            self._chunks = None
            self._needed = self._buffered = 0
            return data
        if self._rest:
            data = self._rest + data
            self._rest = b""
        return data

    def keep(self, data, offset, needed=0):
        """Keep C{data[offset:]} for later: a frame that needs C{needed} bytes in
        all, or (0) one whose header is not complete yet."""
        rest = data[offset:] if offset else data
        if needed:
            self._chunks = [rest]
            self._buffered = len(rest)
            self._needed = needed
        else:
            self._rest = rest

    def clear(self):
        self.__init__()
