"""The message log: fixed-size chunk files written one after the other.

Only the store's writer thread calls a L{MessageLog} or reads its
attributes: the reactor thread reads the chunk files through its own maps
(L{backends.chunked.reads}) and learns what changed (write position, chunks
written or removed) from each commit's result, which L{take_changes} helps
build. Positions
are assigned by the store before records get here, so writing is placing bytes
where they belong: a record that would cross the end of a chunk was already
moved to the start of the next one. A chunk file is created at its full size
(sparse), so unwritten space reads as zeros; once full it gets a footer.

Opening needs no checkpoint of the write position: every chunk's header is
read, and only the last chunk is scanned, record by record, until a length or
CRC check fails; the file is cut there (and grown back to its size, so the
cut-off bytes read as zeros) and writing resumes at that point.

The chunk files' paths, and reading records out of them with pread, are
L{backends.chunked.chunkfiles}.
"""

import os
import time

from twisted.logger import Logger

from backends.chunked.chunkfiles import PREFIX, chunk_path, header_never_written, read_records
from backends.chunked.directio import BLOCK, AlignedWriter, open_for_writing, write_block
from backends.chunked.format import (
    FOOTER_SIZE,
    HEADER_SIZE,
    LENGTH,
    MESSAGE_CHUNK,
    RECORD_OVERHEAD,
    FormatError,
    chunk_numbers,
    decode_footer,
    decode_header,
    decode_progress,
    encode_footer,
    encode_header,
    encode_progress,
    frame_parts,
    full_record_size,
    record_problem,
    sound_records,
)
from backends.common.fileio import fsync_directory
from brokerd.interfaces import StoreCorrupted

log = Logger()

SCAN_BLOCK = 8 << 20  # bytes read at a time when the last chunk is scanned
# Non-zero bytes this close after the last whole record make it a torn tail.
TORN_CHECK_BYTES = 64 << 10
# Small records are joined into one write of up to this much (one call per record is slow).
JOINED_BYTES = 1 << 20
# A body this big is written on its own rather than copied once more by a join.
OWN_WRITE_BODY = 64 << 10


class ChunkFigures:
    """Writes to one chunk, for metrics (its reads are counted by the reactor thread's reader)."""

    __slots__ = ("writes", "bytes_written", "records")

    def __init__(self):
        self.writes = 0
        self.bytes_written = 0
        self.records = 0  # in it, once it is finished (0 before), for compaction


class MessageLog:
    """
    The chunk files of one store's directory.

    @ivar data_size: the bytes of records one chunk holds; fixed for a
        directory by its first chunk, whatever the option says later.
    @ivar write_position: the global position up to which records are
        written to the files.
    @ivar flushed_position: up to which they are also fsynced.
    @ivar chunks: chunk number -> L{ChunkFigures}, one per chunk file there is.
    """

    def __init__(self, directory, data_size):
        self.directory = directory
        self.data_size = data_size
        self.write_position = 0
        self.flushed_position = 0
        self.chunks = {}
        self._deleted = []  # chunk numbers removed since the last take_changes()
        self._touched = {}  # chunk number -> ChunkFigures of chunks created or written since then
        self._newly_finished = []  # chunk numbers given a footer since the last take_finished()
        self._current = None  # number of the chunk being written
        self._descriptor = None  # of the chunk being written
        self._writer = None  # the AlignedWriter of that descriptor
        self._records_in_current = 0
        self._synced_progress = None  # (bytes, records) of the current chunk at the last fsync
        self._written_progress = None  # what its progress block says
        self._unsynced = []  # descriptors written since the last fsync
        self._finished = []  # descriptors of chunks finished since the last sync, closed after it
        self._directory_unsynced = False

    def path_of(self, number):
        return chunk_path(self.directory, number)

    def file_size(self):
        return HEADER_SIZE + self.data_size + FOOTER_SIZE

    def read_records(self, positions):
        """
        The C{(head, body)} of the records at C{positions} (all below
        C{write_position}), for the writer thread. They are read with pread,
        which lets the reactor thread run while the disk works; a page fault
        through a map would hold the interpreter lock for as long.

        @raise KeyError: if a record's chunk is gone.
        @raise StoreCorrupted: if a record is damaged.
        """
        return read_records(self.directory, self.data_size, positions)

    # -- open

    def open(self):
        """Read every chunk's header, scan the last one and take up writing where it ends."""
        numbers = chunk_numbers(self.directory, PREFIX)
        if numbers and header_never_written(self.path_of(numbers[-1])):
            log.warn("chunk {path} has no header: a crash came before it was written, so nothing"
                     " in it was ever synced; removed", path=self.path_of(numbers[-1]))
            os.unlink(self.path_of(numbers.pop()))
        if numbers:
            self._adopt_data_size(numbers[0])
        for number in numbers:
            self._check_header(number)
            self.chunks[number] = ChunkFigures()
            if number != numbers[-1]:
                self.chunks[number].records = self._records_in(number)
        if not numbers:
            return
        last = numbers[-1]
        with open(self.path_of(last), "r+b") as chunk:
            footer = decode_footer(self._footer_block(chunk))
            if footer is not None:
                self.write_position = (last + 1) * self.data_size
                self.chunks[last].records = footer[1]
            else:
                progress = decode_progress(self._footer_block(chunk))
                if progress is not None and progress[0] > self.data_size:
                    progress = None
                used, count = self._scan(chunk, last, *(progress or (0, 0)))
                self.write_position = last * self.data_size + used
                self._records_in_current = count
                self._current = last
                self._synced_progress = self._written_progress = progress
        self.flushed_position = self.write_position
        if self._current is not None:
            offset = HEADER_SIZE + used
            with open(self.path_of(last), "rb") as chunk:
                tail = _pread(chunk.fileno(), offset % BLOCK, offset - offset % BLOCK)
            self._descriptor = open_for_writing(self.path_of(last))
            self._writer = AlignedWriter(self._descriptor, offset, tail)

    def _records_in(self, number):
        """The records a finished chunk's footer counts (0 if it has none)."""
        with open(self.path_of(number), "rb") as chunk:
            footer = decode_footer(self._footer_block(chunk))
        return footer[1] if footer is not None else 0

    def _footer_block(self, chunk):
        """The footer block of the open chunk file C{chunk}: a footer, a progress block or
        zeros."""
        return _pread(chunk.fileno(), FOOTER_SIZE, HEADER_SIZE + self.data_size)

    def _read_header(self, number):
        path = self.path_of(number)
        with open(path, "rb") as chunk:
            data = chunk.read(HEADER_SIZE)
        try:
            return decode_header(data, path)
        except FormatError as problem:
            raise StoreCorrupted(f"{problem}; the message log cannot be read", path, 0) from None

    def _adopt_data_size(self, number):
        """The chunk size a directory was made with holds for good:
        positions map to chunks by it."""
        data_size = self._read_header(number)[3]
        if data_size != self.data_size:
            log.warn(
                "message chunks in {directory} hold {found} bytes each; keeping that size"
                " (the chunk_size option applies to new stores only)",
                directory=self.directory, found=data_size,
            )
            self.data_size = data_size

    def _check_header(self, number):
        path = self.path_of(number)
        kind, found_number, start, data_size = self._read_header(number)
        expected = (MESSAGE_CHUNK, number, number * self.data_size, self.data_size)
        if (kind, found_number, start, data_size) != expected:
            raise StoreCorrupted(
                f"chunk {path} has the header of another chunk (kind {kind}, number"
                f" {found_number}, start {start}, data size {data_size})", path, 0,
            )

    def _scan(self, chunk, number, start=0, records=0):
        """
        The bytes of whole records at the start of the last chunk and their
        count; cut off the rest. The first C{start} bytes (C{records}
        records) are known durable from the chunk's progress block: the
        walk checks what follows them (a record damaged before is found when
        it is read, as in any other chunk).
        """
        descriptor, path = chunk.fileno(), self.path_of(number)
        offset, count, wanted = start, records, 0
        problem, buffer, local = None, b"", 0
        while offset < self.data_size:
            requested = min(max(SCAN_BLOCK, wanted), self.data_size - offset)
            buffer = _pread(descriptor, requested, HEADER_SIZE + offset)
            local, found = sound_records(buffer, 0, len(buffer))
            offset += local
            count += found
            wanted = full_record_size(buffer, local) if local + LENGTH.size <= len(buffer) else 0
            # Stopped because the read ended inside a record (read on from there), or at a record
            # that is not whole?
            if (local + max(wanted, LENGTH.size) > len(buffer) and offset + wanted <= self.data_size
                    and (local or requested < wanted)):
                continue
            problem = record_problem(buffer, local, len(buffer))
            break
        if problem is not None and any(buffer[local : local + TORN_CHECK_BYTES]):
            log.warn(
                "chunk {path}: the record at data offset {offset} is torn ({problem});"
                " the chunk is cut there and writing resumes at that point",
                path=path, offset=offset, problem=problem,
            )
            os.ftruncate(descriptor, HEADER_SIZE + offset)
            os.ftruncate(descriptor, self.file_size())
            os.fsync(descriptor)
        return offset, count

    # -- writes

    def write(self, records):
        """
        Write records (C{(position, head, body)} in position order) where
        their positions say, starting new chunks (and finishing old ones) as
        needed. C{write_position} moves only once the bytes are written, as
        the reactor thread reads everything below it from the files.
        """
        run_start, end = None, None
        parts, joined = [], 0  # record parts not yet handed to the writer
        for position, head, body in records:
            number = position // self.data_size
            if number != self._current:
                self._write_joined(parts)
                parts, joined = [], 0
                self._flush_run(run_start, end)
                run_start = None
                self._start_chunk(number)
            if run_start is None:
                run_start = position
                self._skip_to(HEADER_SIZE + position % self.data_size)
            prefix, body, tail = frame_parts(head, body)
            if len(body) >= OWN_WRITE_BODY:
                parts.append(prefix)
                self._write_joined(parts)
                self._writer.write(body)
                parts, joined = [tail], 0
            else:
                parts += (prefix, body, tail)
                joined += len(prefix) + len(body)
                if joined >= JOINED_BYTES:
                    self._write_joined(parts)
                    parts, joined = [], 0
            self._records_in_current += 1
            end = position + RECORD_OVERHEAD + len(head) + len(body)  # record_size, inline
        self._write_joined(parts)
        self._flush_run(run_start, end)

    def _write_joined(self, parts):
        if parts:
            self._writer.write(parts[0] if len(parts) == 1 else b"".join(parts))

    def _skip_to(self, offset):
        """Records of a batch follow one another; only a new chunk's first one may start further
        on."""
        if self._writer.offset != offset:
            raise RuntimeError(f"chunk {self._current}: a record at offset {offset},"
                               f" the file ends at {self._writer.offset}")

    def _flush_run(self, start, end):
        if start is None:
            return
        self._writer.flush()
        figures = self.chunks[self._current]
        figures.writes += 1
        figures.bytes_written += end - start
        self._touched[self._current] = figures
        self.write_position = end
        if self._descriptor not in self._unsynced:
            self._unsynced.append(self._descriptor)

    def _start_chunk(self, number):
        """Finish the chunk being written (footer) and create chunk C{number}."""
        if self._current is not None:
            used = self.write_position - self._current * self.data_size
            write_block(self._descriptor, HEADER_SIZE + self.data_size,
                        encode_footer(used, self._records_in_current))
            if self._descriptor not in self._unsynced:
                self._unsynced.append(self._descriptor)
            self._finished.append(self._descriptor)
            self._writer.close()
            self._newly_finished.append(self._current)
            self.chunks[self._current].records = self._records_in_current
        path = self.path_of(number)
        descriptor = open_for_writing(path, create=True)
        os.ftruncate(descriptor, self.file_size())
        write_block(descriptor, 0,
                    encode_header(MESSAGE_CHUNK, number, number * self.data_size, self.data_size))
        self._current, self._descriptor, self._records_in_current = number, descriptor, 0
        self._synced_progress = self._written_progress = None
        self._writer = AlignedWriter(descriptor, HEADER_SIZE)
        self.write_position = number * self.data_size
        self.chunks[number] = self._touched[number] = ChunkFigures()
        self._unsynced.append(descriptor)
        self._directory_unsynced = True

    def sync(self, fsync):
        """Make what was written durable (if C{fsync}); close the descriptors of finished chunks."""
        if fsync:
            self._write_progress()
            for descriptor in self._unsynced:
                # The file's size never changes: its data is all there is to sync.
                os.fdatasync(descriptor)
            if self._directory_unsynced:
                fsync_directory(self.directory)
                self._directory_unsynced = False
            self.flushed_position = self.write_position
            if self._current is not None:
                self._synced_progress = (self.write_position - self._current * self.data_size,
                                         self._records_in_current)
        self._unsynced = []
        finished, self._finished = self._finished, []
        for descriptor in finished:
            os.close(descriptor)

    def _write_progress(self):
        """
        Before an fsync, record in the current chunk's footer block how far
        the last fsync made it durable, so that opening walks only what
        came after (its records unproven). The block goes with the chunk's
        data in the same fsync; it is only ever behind the truth. True if it
        wrote the block.
        """
        progress = self._synced_progress
        if progress is None or progress == self._written_progress or self._descriptor is None:
            return False
        write_block(self._descriptor, HEADER_SIZE + self.data_size, encode_progress(*progress))
        self._written_progress = progress
        if self._descriptor not in self._unsynced:
            self._unsynced.append(self._descriptor)
        return True

    # -- cleanup

    def take_finished(self):
        """The numbers of the chunks given a footer since the last call."""
        finished, self._newly_finished = self._newly_finished, []
        return finished

    def deletable(self, number):
        """True if chunk C{number} is finished: older than the chunk being written, if any."""
        return self._current is None or number < self._current

    def delete(self, number):
        """Remove a chunk whose records no queue needs any more (never the one being written)."""
        os.unlink(self.path_of(number))
        self.chunks.pop(number, None)
        self._touched.pop(number, None)
        self._deleted.append(number)
        self._directory_unsynced = True

    def take_changes(self):
        """
        What changed since the last call, as values the writer no longer
        touches: C{(deleted, figures)}, the chunk numbers removed (a tuple)
        and C{{chunk number: (writes, bytes written)}} of chunks created or
        written.
        """
        deleted, self._deleted = tuple(self._deleted), []
        touched, self._touched = self._touched, {}
        return deleted, {number: (figures.writes, figures.bytes_written)
                         for number, figures in touched.items()}

    def completed_at(self, number):
        """When chunk C{number}'s file was last changed (its footer written), in seconds since the
        epoch."""
        try:
            return os.stat(self.path_of(number)).st_mtime
        except FileNotFoundError:
            return time.time()

    def close(self):
        """
        Close the files. The chunk being written first gets a progress block
        naming the last fsync itself, so that opening after a clean stop
        walks none of it: a record damaged since is then found when it is
        read, instead of being taken for a torn tail that cuts off every
        record after it.
        """
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._descriptor is not None:
            if self._write_progress():
                os.fdatasync(self._descriptor)
            os.close(self._descriptor)
            self._descriptor = None
        for descriptor in self._finished:
            os.close(descriptor)
        self._finished = []


def _pread(descriptor, size, offset):
    return os.pread(descriptor, max(size, 0), offset)
