"""What the filelog store's writer thread does to its files (L{FilelogWriter}):
recovery at open, each commit's batch, the windows of delayed messages.

Everything here runs on the store's one writer thread (L{GroupCommit}'s),
one call at a time, so it needs no locks. The reactor thread reads none of
its state: the L{Figures} and each queue file's L{QueueUpdate} (where its
records are, and a descriptor of its own to read them with) reach it as
values, in the L{Recovery} and in each commit's L{BatchWritten}.

Handles carry a route in their low C{ROUTE_BITS} bits (see
L{backends.filelog.reads.Routes}); open numbers the valid records of the
queue files in queue order, each file's with the route of its queue alone.

The directory holds a lock file (flocked while a store has it open), the
topology file, one L{QueueFile} per durable queue that was ever written to,
and the delayed messages' log and meta file (L{FilelogDelayedLog}).
"""

import os
from itertools import compress
from typing import NamedTuple

from twisted.logger import Logger

from backends.common.fileio import TEMPORARY_SUFFIX, fsync_directory, lock_directory, replace_file
from backends.common.topology_file import TOPOLOGY_FILE, kept_queue_names, read_topology
from backends.filelog.delayedlog import FilelogDelayedLog
from backends.filelog.figures import Figures
from backends.filelog.queuefile import COMPACT_SUFFIX, DATA_SUFFIX, QueueFile, queue_file_name
from backends.filelog.records import queue_of_header
from brokerd.interfaces import StoreCorrupted
from brokerd.proto import messages_pb2

log = Logger()

LOCK_FILE = "lock"
HEADER_READ_SIZE = 4096  # more than any header: queue and vhost names are at most 255 bytes
ROUTE_BITS = 20  # the low bits of a handle: which queues its message was appended to


class Recovery(NamedTuple):
    """What L{FilelogWriter.open} found, for the store to serve C{topology},
    C{recovered_handles} and loads from."""

    topology: list  # topology records in file order
    queues: list  # the durable queues' keys in topology order: queue i's handles carry route i + 1
    # queue key -> (first handle, count): its messages' handles, each 1 << ROUTE_BITS after the last
    recovered: dict
    files: dict  # queue key -> QueueUpdate of its file (with a descriptor the receiver owns)
    damaged: dict  # queue key -> StoreCorrupted
    next_sequence: int  # the handle of the next message appended, shifted right by ROUTE_BITS
    delayed: object = None  # the FilelogDelayedRecovery of the delayed log
    # queue key -> {handle: delivery count}, for messages that came back unacked
    delivery_counts: dict = {}
    figures: object = None  # the FiguresNow of the files as open leaves them


class BatchWritten(NamedTuple):
    """What a commit hands back to the reactor thread."""

    figures: object  # the FiguresNow of the files after it
    files: dict  # queue key -> QueueUpdate, of the files it appended to, created or compacted


class FilelogWriter:
    """The topology file, the queue files and the delayed log under one directory, on the writer
    thread."""

    def __init__(self, directory, compact_min_records, compact_valid_ratio,
                 delayed_bucket_ms=60_000):
        self.directory = directory
        self.topology_path = os.path.join(directory, TOPOLOGY_FILE)
        self.compact_min_records = compact_min_records
        self.compact_valid_ratio = compact_valid_ratio
        self.figures = Figures()
        self._delayed = FilelogDelayedLog(directory, delayed_bucket_ms, compact_min_records,
                                          compact_valid_ratio, self.figures)
        self._files = {}  # queue key -> QueueFile
        self._unsynced = set()  # QueueFile objects written to since their last fsync
        self._directory_unsynced = False  # files created, renamed or removed since the last fsync
        self._lock = None  # descriptor of the lock file, flocked while the store is open

    def path_of(self, queue):
        return os.path.join(self.directory, queue_file_name(queue))

    # -- open

    def open(self):
        """
        Take the directory, read the topology and every queue file it names.

        @return: a L{Recovery}; messages are numbered from 1 in queue order.
        @raise StoreCorrupted: if the topology file is damaged.
        @raise DirectoryInUse: if another open store holds the directory.
        """
        os.makedirs(self.directory, exist_ok=True)
        self._take_lock()
        self._remove_leftovers()
        topology = read_topology(self.topology_path)
        queues = [(record.vhost, record.name) for record in topology
                  if isinstance(record, messages_pb2.QueueRecord)]
        recovered, damaged, sequence = {}, {}, 1
        for route, queue in enumerate(queues, 1):
            first = sequence << ROUTE_BITS | route
            try:
                count = self._recover(queue, first)
            except StoreCorrupted as damage:
                damaged[queue] = damage
            else:
                recovered[queue] = (first, count)
                sequence += count
        self._log_orphans(queues, kept_queue_names(topology))
        delivery_counts = {}
        for queue, queue_file in list(self._files.items()):
            if queue_file.delivery_counts:
                delivery_counts[queue] = dict(queue_file.delivery_counts)
            self._compact_if_worth_it(queue_file)
        delayed = self._delayed.open()
        files = self._reports(self._files.values())
        return Recovery(topology, queues, recovered, files, damaged, sequence, delayed,
                        delivery_counts, self.figures.now())

    def _take_lock(self):
        """Two stores writing the same files would corrupt them; the second to open fails
        instead."""
        self._lock = lock_directory(os.path.join(self.directory, LOCK_FILE), "filelog")

    def _remove_leftovers(self):
        """Temporary files of an interrupted topology replacement or compaction: the
        rename never happened, so the file they were to replace is still whole."""
        for file_name in os.listdir(self.directory):
            if file_name.endswith((TEMPORARY_SUFFIX, COMPACT_SUFFIX)):
                os.unlink(os.path.join(self.directory, file_name))

    def _recover(self, queue, first_handle):
        path = self.path_of(queue)
        try:
            descriptor = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return 0  # nothing was ever written for the queue
        except OSError as problem:
            raise StoreCorrupted(f"queue file {path} cannot be opened: {problem.strerror}",
                                 path) from None
        queue_file = self._files[queue] = QueueFile(queue, path, descriptor, self.figures)
        return queue_file.recover(first_handle, 1 << ROUTE_BITS)

    def _log_orphans(self, queues, kept):
        """
        Name the queue files no queue of the topology holds (they are left
        alone); those of quarantined queues (C{kept}: their keys, and whether
        one has no readable name) are kept unread, and said so.
        """
        kept_queues, unnamed = kept
        expected = {queue_file_name(queue) for queue in queues}
        kept_names = {queue_file_name(queue) for queue in kept_queues}
        for file_name in sorted(os.listdir(self.directory)):
            if file_name.endswith(DATA_SUFFIX) and file_name not in expected:
                path = os.path.join(self.directory, file_name)
                with open(path, "rb") as orphan:
                    queue = queue_of_header(orphan.read(HEADER_READ_SIZE))
                if file_name in kept_names or unnamed:
                    log.warn("queue file {path} (of queue {queue}) is kept as it is, unread:"
                             " it may hold the messages of a quarantined queue",
                             path=path, queue=repr(queue) if queue else "unknown")
                    continue
                log.warn(
                    "queue file {path} (of queue {queue}) belongs to no queue of the topology;"
                    " ignored",
                    path=path, queue=repr(queue) if queue else "unknown: no whole header",
                )

    # -- commits

    def write_batch(self, batch, fsync):
        """
        Apply one L{Batch}, in the order that keeps a crash at any point
        consistent: topology, removed queue files, appends (one write per file),
        acks, delivery counts, compaction; then, if C{fsync}, make everything
        written durable. Files found damaged by the reactor thread are left
        alone from then on.

        @return: the L{BatchWritten}, for the reactor thread.
        """
        touched = set()  # QueueFile objects appended to, created or compacted
        if batch is not None:
            for queue, damage in batch.damaged.items():
                queue_file = self._files.get(queue)
                if queue_file is not None and queue_file.damage is None:
                    self._unsynced.discard(queue_file)
                    queue_file.mark_damaged(damage)
            if batch.topology is not None:
                self.figures.syncs += replace_file(self.topology_path, batch.topology,
                                                   sync_directory=fsync)
                self._directory_unsynced = self._directory_unsynced or not fsync
            for queue in batch.deleted:
                self._remove(queue)
            framings = {}  # handle -> (header, trailer), shared by the files of one message
            for queue, handles in batch.appends.items():
                if handles:
                    queue_file = self._files.get(queue) or self._create(queue)
                    if queue_file.damage is None:
                        queue_file.append(handles, batch.records, framings)
                        self._unsynced.add(queue_file)
                        touched.add(queue_file)
            for queue, handles in batch.acks.items():
                queue_file = self._files.get(queue)
                if queue_file is not None and queue_file.ack(handles):
                    self._unsynced.add(queue_file)
                    self._compact_if_worth_it(queue_file, touched)
            for queue, counts in batch.returns.items():
                queue_file = self._files.get(queue)
                if queue_file is not None and queue_file.returned(counts):
                    self._unsynced.add(queue_file)
                    self._compact_if_worth_it(queue_file, touched)
            if batch.delays or batch.delay_releases or batch.delay_lease is not None:
                self._delayed.write(batch.delay_lease, batch.delays, batch.delay_releases, fsync)
                if batch.delay_releases:
                    self._delayed.compact_if_worth_it()
        if fsync:
            self._sync()
            self._delayed.sync()
        return BatchWritten(self.figures.now(), self._reports(touched))

    def delayed_window(self, cursor, until, limit):
        """The rows of L{FilelogDelayedLog.window}: the delayed messages due in a window,
        from the log."""
        return self._delayed.window(cursor, until, limit)

    @staticmethod
    def _reports(queue_files):
        """The L{QueueUpdate}s the reactor thread needs of C{queue_files}, by queue key."""
        reports = {}
        for queue_file in queue_files:
            update = queue_file.report()
            if update is not None:
                reports[queue_file.queue] = update
        return reports

    def _create(self, queue):
        queue_file = self._files[queue] = QueueFile.create(queue, self.path_of(queue), self.figures)
        self._directory_unsynced = True
        return queue_file

    def _remove(self, queue):
        queue_file = self._files.pop(queue, None)
        if queue_file is not None:
            self._unsynced.discard(queue_file)
            self.figures.file_bytes -= queue_file.size
            self.figures.held -= queue_file.held
            self.figures.held_bytes -= sum(compress(queue_file.sizes, queue_file.valid))
            queue_file.close()
        try:
            os.unlink(self.path_of(queue))
        except FileNotFoundError:
            return
        self._directory_unsynced = True

    def _sync(self):
        for queue_file in self._unsynced:
            queue_file.fsync()
        self._unsynced.clear()
        if self._directory_unsynced:
            fsync_directory(self.directory)
            self.figures.syncs += 1
            self._directory_unsynced = False

    def _compact_if_worth_it(self, queue_file, touched=None):
        if queue_file.worth_compacting(self.compact_min_records, self.compact_valid_ratio):
            try:
                queue_file.compact()
            except OSError:
                log.failure("compaction of queue file {path} failed; the file stays as it was",
                            path=queue_file.path)
            else:
                self._unsynced.discard(queue_file)  # the compacted file is fsynced whole
                if touched is not None:
                    touched.add(queue_file)

    def close(self):
        """Close every file and give up the lock (once no commit can run any more)."""
        for queue_file in self._files.values():
            queue_file.close()
        self._files.clear()
        self._delayed.close()
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
