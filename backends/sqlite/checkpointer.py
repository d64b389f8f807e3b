"""Checkpoints of the SQLite write-ahead log on a thread and connection of their own,
so the writer's commits never wait for one."""

import sqlite3
import threading

from twisted.logger import Logger

log = Logger()

LOCK_WAIT_SECONDS = 2.0  # how long a connection waits for another one to let go of the file
CHECKPOINT_BYTES = 8 << 20  # write-ahead log grown by this much since the last checkpoint: run one
# A log at least RESTART_BYTES long is written from its start again once all of it is copied,
# so it stays about that long: writing over a file's blocks is much faster than growing it.
RESTART_BYTES = 32 << 20
CATCH_UP_BYTES = 4 << 20  # what is left for the writer to copy before it starts the log over
CATCH_UP_ROUNDS = 4  # checkpoints in a row the Checkpointer runs to get there


class Checkpointer:
    """
    Copies the write-ahead log into the database file on a thread and
    connection of its own, so that commits on the writer's connection (which
    has automatic checkpoints turned off) wait for no checkpoint.

    A checkpoint is PASSIVE: it copies the frames committed when it starts,
    syncs the database file (unless C{synchronous} is OFF) and only then marks
    them copied, and it never holds back a commit. A commit stays durable in
    the log until then; SQLite writes the log from its start again only once
    every frame in it has been copied.

    @param path: the database file.
    @param synchronous: the writer's C{PRAGMA synchronous}, which decides
        whether a checkpoint syncs the database file.
    """

    def __init__(self, path, synchronous):
        self.path = path
        self._db = sqlite3.connect(path, timeout=LOCK_WAIT_SECONDS, check_same_thread=False,
                                   isolation_level=None)
        self._db.execute(f"PRAGMA synchronous = {synchronous}")
        self._db.execute("PRAGMA wal_autocheckpoint = 0")
        self._wake = threading.Condition()
        self._grown = 0  # bytes committed since the last checkpoint started
        self._stopping = False
        self.log_bytes = 0  # length of the write-ahead log as the last checkpoint found it
        # The log is long and a checkpoint on the writer's connection would let it start over.
        self.behind = False
        self._thread = threading.Thread(target=self._run, name="brokerd-sqlite-checkpointer",
                                        daemon=True)
        self._thread.start()

    def committed(self, size):
        """The writer committed about C{size} bytes; wakes the thread once enough have piled up."""
        with self._wake:
            self._grown += size
            if self._grown >= CHECKPOINT_BYTES:
                self._wake.notify()

    def _run(self):
        try:
            frame_bytes = self._db.execute("PRAGMA page_size").fetchone()[0]
            while True:
                with self._wake:
                    while not self._stopping and self._grown < CHECKPOINT_BYTES:
                        self._wake.wait()
                    if self._stopping:
                        return
                    self._grown = 0
                # The log starts over only if it is copied to its end when the writer begins a
                # transaction, which a busy writer seldom lets happen. So once it is long, copy
                # what was committed during each checkpoint in one more, until one has little
                # to do, and leave the little committed during the last to the writer.
                before = None
                for _ in range(CATCH_UP_ROUNDS):
                    try:
                        busy, frames, copied = self._db.execute(
                            "PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    except sqlite3.Error as error:
                        log.warn("sqlite store {path}: checkpoint failed ({error})",
                                 path=self.path, error=error)
                        break
                    self.log_bytes = max(frames, 0) * frame_bytes
                    if busy or self.log_bytes < RESTART_BYTES:
                        break
                    if before is not None and (copied - before) * frame_bytes <= CATCH_UP_BYTES:
                        break
                    before = copied
                else:
                    busy = True
                if not busy and self.log_bytes >= RESTART_BYTES:
                    self.behind = True
        finally:
            self._db.close()

    def stop(self):
        """End the thread after the checkpoint it is running, and close its connection."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not threading.current_thread():
            self._thread.join()
