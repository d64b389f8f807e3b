"""What the chunked store's reactor thread has put in the log and not handed to
the writer yet, and what it handed over but the files do not hold yet
(L{PendingWrites}).

The reactor thread gives every record its position in the log as it is
buffered (L{PendingWrites.place}): a message's handle is that position, known
before anything is written. A record never crosses the end of a chunk: one
that would is placed at the start of the next chunk, and the writer leaves
the space before it zero-filled. Messages are read back from here until
a commit's result says the files hold them.
"""

from backends.chunked.format import record_size
from backends.chunked.handover import Batch
from backends.common.message_heads import MessageHeads


class MessageTooLarge(ValueError):
    """A message whose record would not fit in one chunk."""


class PendingWrites:
    """
    The records placed in the log and the changes buffered since the last
    commit (C{batch}, which the store fills), and the batches handed over
    whose records may not be in the files yet.

    @ivar batch: the L{Batch} being buffered.
    @ivar position: where the next record goes.
    @ivar data_size: the bytes of records one chunk holds.
    """

    def __init__(self, data_size):
        self.batch = Batch()
        self.position = 0
        self.data_size = data_size
        # batches handed to the writer whose records may not be in the files yet
        self._in_flight = []
        self._heads = MessageHeads()

    def recovered(self, position, data_size):
        """The writer's open found the log written up to C{position}, in chunks of
        C{data_size} bytes of records."""
        self.position = position
        self.data_size = data_size

    def place(self, message):
        """
        Give the record of C{message} its position in the log: C{(position,
        head, body)}, for the caller to buffer.

        @raise MessageTooLarge: if the record would not fit in one chunk.
        """
        head = self._heads.encode(message)
        body = message.body
        if type(body) is not bytes:
            body = bytes(body)
        size = record_size(head, len(body))
        data_size = self.data_size
        if size > data_size:
            raise MessageTooLarge(
                f"a message of {len(body)} bytes does not fit in a chunk of {data_size} bytes;"
                " raise the chunked backend's chunk_size or lower --max-message-size"
            )
        position = self.position
        room = data_size - position % data_size
        if size > room:
            position += room  # the record goes to the start of the next chunk
        self.position = position + size
        return position, head, body

    def place_copies(self, handles, records):
        """
        Buffer the copies of a compaction slice's records (C{(head, body)} of
        C{handles}) at the head of the log, with the pairs (handle, new position).
        """
        batch, position, data_size = self.batch, self.position, self.data_size
        for handle, (head, body) in zip(handles, records):
            size = record_size(head, len(body))
            room = data_size - position % data_size
            if size > room:
                position += room  # the record goes to the start of the next chunk
            batch.records.append((position, head, body))
            batch.moves.append((handle, position))
            position += size
        self.position = position

    def drop_slice(self):
        """The last compaction slice handed back could not be read: the writer leaves its chunk
        alone."""
        self.batch.slice_dropped = True

    def message(self, handle):
        """The message appended as C{handle} while its record may not be in the files yet, or
        None."""
        message = self.batch.messages.get(handle)
        if message is None:
            for batch in self._in_flight:
                message = batch.messages.get(handle)
                if message is not None:
                    return message
        return message

    def take(self, delayed_meta, topology):
        """
        Hand over the batch buffered, with the delayed index's new meta and
        the topology file's new contents if they changed (None if not): the
        batch, the writer's from now on, or None if there is nothing to write.
        """
        batch = self.batch
        if delayed_meta is not None:
            batch.delayed_meta = delayed_meta
        if topology is not None:
            batch.topology = topology
        elif batch.is_empty():
            return None
        batch.end = self.position
        self.batch = Batch()
        if batch.records:
            self._in_flight.append(batch)
        return batch

    def written(self, position):
        """A commit's result says the files hold every record below C{position}."""
        if self._in_flight:
            self._in_flight = [batch for batch in self._in_flight if batch.end > position]

    def clear(self):
        """The store closes: forget the batches handed over."""
        self._in_flight = []
