"""What the chunked store's two threads hand each other, as values.

The reactor thread buffers changes in a L{Batch}, which belongs to the writer
thread once handed over; the writer's open answers with a L{Recovery} and each
commit with a L{BatchWritten}, which the writer never changes afterwards. So
the two threads share no mutable object, and the reactor thread never reads
the writer's (L{backends.chunked.writer}).
"""

from typing import NamedTuple


class Batch:
    """
    What the reactor thread buffered since the last commit, shaped for the
    writer: the reactor's until its L{PendingWrites<backends.chunked.pendingwrites.PendingWrites>}
    hands it over, the writer thread's from then on (the reactor only reads
    its C{messages} until the records are in the files).
    """

    __slots__ = ("records", "messages", "appends", "acks", "returns", "shared", "deleted",
                 "topology", "end", "delays", "delay_releases", "delayed_meta", "kept_aside",
                 "moves", "slice_dropped")

    def __init__(self):
        self.records = []  # (position, head, body), in position order
        self.messages = {}  # handle -> message, for reads until the records are written
        self.appends = {}  # queue key -> [handle], in queue order
        self.acks = {}  # queue key -> [handle]
        self.returns = {}  # queue key -> {handle: delivery count}
        self.shared = {}  # handle -> number of queues, for messages appended to more than one
        self.deleted = []  # queue keys whose indexes go before this batch's appends
        self.topology = None  # the new topology file's contents, if it changed
        self.end = 0  # the log position after this batch's last record
        self.delays = []  # (due, delayed handle, position, exchange number), in handle order
        self.delay_releases = []  # (delayed handle, due, chunk number)
        self.delayed_meta = None  # the delayed index's new Meta, if it changed
        self.kept_aside = {}  # quarantine file name -> (head, body) of a record that does not parse
        self.moves = []  # (handle, position) of the copies among the records, made by compaction
        self.slice_dropped = False  # the last compaction slice handed back could not be read

    def is_empty(self):
        return not (self.records or self.acks or self.returns or self.deleted or self.delay_releases
                    or self.delayed_meta or self.kept_aside or self.slice_dropped)


class BatchWritten(NamedTuple):
    """
    What the files are like after a commit, for the reactor thread: handed
    back through the group commit, so the reactor never reads the writer's
    objects.
    """

    write_position: int  # records below it are in the chunk files, and may be read from them
    flushed_position: int  # records below it are fsynced too
    deleted_chunks: tuple  # message chunk numbers whose files were removed by this commit
    # chunk number -> (writes, bytes written), of the chunks created or written by it
    chunk_figures: dict
    held_messages: int  # messages some queue holds
    held_bytes: int  # and their body bytes
    delayed_flushes: int  # flushes of the delayed index so far
    moved: dict = {}  # handle -> position, of records compaction moved in this commit
    unmoved: tuple = ()  # moved handles no queue holds any more: their pairs are forgotten
    compaction: tuple = ()  # (handle, position) of held records to copy to the head of the log
    compacted_chunks: int = 0  # chunks compacted so far
    compacted_bytes: int = 0  # and the bytes of records they moved
    # seconds until a sparse chunk is quiet enough to compact (0: none waits)
    compaction_due_in: float = 0.0


class Recovery(NamedTuple):
    """What the writer's open found, for the store to answer C{topology} and C{recover}."""

    topology: list  # topology records in file order
    unacked: dict  # queue key -> handles of its un-acked entries (an array), in queue order
    damaged: dict  # queue key -> StoreCorrupted
    write_position: int
    data_size: int
    delayed: object = None  # the ChunkedDelayedRecovery of the delayed-message index
    # queue key -> {handle: delivery count}, for messages that came back unacked
    delivery_counts: dict = {}
    # the files as open leaves them: every chunk there is, with no writes yet
    written: BatchWritten = None
    moves: dict = {}  # handle -> position of the records compaction moved, for the messages held
