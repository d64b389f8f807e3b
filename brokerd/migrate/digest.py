"""What a migration compares between source and target: per-queue counts and
digests over each message's content and place, the delayed messages, the
topology; and which files of the data directory a run created or changed.

A queue's digest covers, in queue order, each message's exchange, routing
key, properties, body and publish time (TTL), with its redelivered flag and
delivery count; the delayed digest covers each delayed message's due time,
exchange and content in due order. Handles are left out: each store gives
its own.
"""

import hashlib
import os
import struct

DIGEST_SIZE = 16


_LENGTHS = struct.Struct("<QQQQq")


def message_digest(message):
    """
    A digest of what a consumer gets of C{message} (a store's
    L{brokerd.interfaces.MessageRecord}) and of its TTL clock: the lengths of
    its parts first, so that no two different messages hash alike.
    """
    exchange, routing_key = message.exchange.encode(), message.routing_key.encode()
    properties = message.properties.SerializeToString(deterministic=True)
    published_at = -1 if message.published_at is None else message.published_at
    lengths = _LENGTHS.pack(
        len(exchange), len(routing_key), len(properties), len(message.body), published_at
    )
    hasher = hashlib.blake2b(lengths, digest_size=DIGEST_SIZE)
    hasher.update(exchange + routing_key + properties)
    hasher.update(message.body)
    return hasher.digest()


class QueueTally:
    """The count and running digest of one queue's messages, in order."""

    __slots__ = ("count", "_hasher")

    def __init__(self):
        self.count = 0
        self._hasher = hashlib.blake2b(digest_size=DIGEST_SIZE)

    def add(self, digest, redelivered, delivery_count):
        self.count += 1
        self._hasher.update(
            digest + bytes((1 if redelivered else 0,)) + delivery_count.to_bytes(8, "little")
        )

    def summary(self):
        return self.count, self._hasher.hexdigest()


class Tallies:
    """
    Everything compared after a migration: one L{QueueTally} per queue, the
    delayed messages, the topology.
    """

    def __init__(self):
        self.queues = {}  # queue key -> QueueTally
        self.delayed = QueueTally()
        self.topology = set()  # (record type name, serialized record)

    def queue(self, key):
        tally = self.queues.get(key)
        if tally is None:
            tally = self.queues[key] = QueueTally()
        return tally

    def add_record(self, record):
        self.topology.add((type(record).__name__, record.SerializeToString(deterministic=True)))

    def add_delayed(self, delayed, message):
        prefix = f"{delayed.due}\0{delayed.exchange[0]}\0{delayed.exchange[1]}".encode()
        hasher = hashlib.blake2b(prefix + message_digest(message), digest_size=DIGEST_SIZE)
        self.delayed.add(hasher.digest(), False, 0)

    def differences(self, other):
        """Lines naming each way C{other} (the target's) differs from these (the source's)."""
        lines = []
        if self.topology != other.topology:
            lines.append(
                f"topology: {len(self.topology)} records in the source, {len(other.topology)}"
                f" in the target, {len(self.topology - other.topology)} of the source's missing"
                " or changed"
            )
        for key in sorted(set(self.queues) | set(other.queues)):
            mine = self.queues.get(key, QueueTally()).summary()
            theirs = other.queues.get(key, QueueTally()).summary()
            if mine != theirs:
                if mine[0] == theirs[0]:
                    what = "checksums differ"
                else:
                    what = f"{mine[0]} messages became {theirs[0]}"
                lines.append(f"queue {key[1]!r} in vhost {key[0]!r}: {what}")
        if self.delayed.summary() != other.delayed.summary():
            mine, theirs = self.delayed.count, other.delayed.count
            what = "checksums differ" if mine == theirs else f"{mine} became {theirs}"
            lines.append(f"delayed messages: {what}")
        return lines


def snapshot(directory):
    """
    Every file under C{directory}: path -> (size, mtime in ns); and every
    directory, path -> None.
    """
    found = {}
    for root, directories, files in os.walk(directory):
        for name in directories:
            found[os.path.join(root, name)] = None
        for name in files:
            path = os.path.join(root, name)
            try:
                status = os.stat(path)
            except FileNotFoundError:
                continue
            found[path] = (status.st_size, status.st_mtime_ns)
    return found


def changed_files(before, after):
    """The files of C{before} that are gone or whose size or modification time changed."""
    return sorted(
        path for path, state in before.items()
        if state is not None and after.get(path) != state
    )


def remove_new(before, directory):
    """
    Remove the files and then the (emptied) directories under C{directory} that
    C{before} does not hold.
    """
    now = snapshot(directory)
    for path in sorted(
        path for path, state in now.items() if state is not None and path not in before
    ):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    directories = (path for path, state in now.items() if state is None and path not in before)
    for path in sorted(directories, reverse=True):
        try:
            os.rmdir(path)
        except OSError:
            pass
