"""The replication stream's frames: a fixed header, then the frame's payload.

Every frame is C{length:u32 | kind:u8 | payload}, C{length} counting the kind
and the payload. An operation's payload is C{sequence:u64 | operation:u8 |
record length:u32 | record | body}: the record a serialised
C{brokerd.proto.replication_pb2.ReplicatedOperation}, the body the message's
bytes as they are, so the leader writes them without copying them into a frame
and the follower takes them with one slice. Lengths are checked against a cap
before any memory is taken for a frame; the decoder reads each byte once.
"""

import struct

from brokerd.proto import replication_pb2

FRAME_HEADER = struct.Struct(">IB")
OPERATION_HEADER = struct.Struct(">QBI")
SEQUENCE = struct.Struct(">Q")
BODY_LENGTH = struct.Struct(">I")  # of each body of an append run
POSITION = struct.Struct(">QQB")  # epoch, sequence, flags
NONCE_SIZE = 32
MAC_SIZE = 32
MAGIC = b"brokerd-replication/1"

# Frame kinds.
HELLO = 1  # leader -> follower: MAGIC | nonce
# follower -> leader: nonce | mac | epoch | sequence | flags | cluster id | node name
AUTH = 2
WELCOME = 3  # leader -> follower: mac | epoch | history | cluster id
REFUSE = 4  # leader -> follower: why, in UTF-8
OPERATION = 5  # leader -> follower
ACK = 6  # follower -> leader: the highest sequence its store's durable commit covers
RESYNC = 7  # leader -> follower: why the follower cannot resume, in UTF-8
READY = 8  # follower -> leader: its stores are wiped, send the snapshot
SNAPSHOT = 9  # leader -> follower: an operation of a snapshot (sequence: the message's id)
SNAPSHOT_END = 10  # leader -> follower: the stream position the snapshot stands for
KINDS = {HELLO: "hello", AUTH: "auth", WELCOME: "welcome", REFUSE: "refuse",
         OPERATION: "operation", ACK: "ack", RESYNC: "resync", READY: "ready",
         SNAPSHOT: "snapshot", SNAPSHOT_END: "snapshot end"}

# Flags of an auth frame: the follower's stores cannot resume any stream (they were
# last written as a leader's, hold data of unknown history, or an unfinished snapshot).
NOT_RESUMABLE = 1

# Operation codes: the store contract's mutating calls.
SAVE_EXCHANGE, DELETE_EXCHANGE, SAVE_QUEUE, DELETE_QUEUE = 1, 2, 3, 4
SAVE_BINDING, DELETE_BINDING, APPEND, ACK_MESSAGE = 5, 6, 7, 8
RETURNED, PURGE, DELAY, RELEASE = 9, 10, 11, 12
ACCESS_DOCUMENT = 13  # the leader's access database, its JSON document as the body
# Appends alike (one record for all), numbered on from the frame's sequence: the body is the
# messages' bodies, each as C{length:u32 | bytes}. A run is applied whole or not at all.
APPEND_RUN = 14
OPERATIONS = {
    SAVE_EXCHANGE: "save_exchange", DELETE_EXCHANGE: "delete_exchange",
    SAVE_QUEUE: "save_queue", DELETE_QUEUE: "delete_queue", SAVE_BINDING: "save_binding",
    DELETE_BINDING: "delete_binding", APPEND: "append", ACK_MESSAGE: "ack",
    RETURNED: "returned", PURGE: "purge", DELAY: "delay", RELEASE: "release",
    ACCESS_DOCUMENT: "access_document", APPEND_RUN: "append run",
}
# What a snapshot may hold: a store's state at one position, built from nothing.
SNAPSHOT_OPERATIONS = frozenset(
    (SAVE_EXCHANGE, SAVE_QUEUE, SAVE_BINDING, APPEND, RETURNED, DELAY, ACCESS_DOCUMENT))

# Before a peer has authenticated it may send only small frames.
HANDSHAKE_FRAME_LIMIT = 4096
# Default cap of an operation frame: RabbitMQ's largest message (128 MiB) and its record.
DEFAULT_FRAME_LIMIT = 128 * 1024 * 1024 + 1024 * 1024
NAME_LIMIT = 255
# A leader's history: (epoch, sequence where that epoch ended), newest first, at most this many.
HISTORY_LIMIT = 16
EPOCH_END = struct.Struct(">QQ")


class StreamError(Exception):
    """A peer sent something the replication protocol does not allow; the text names it."""


def frame(kind, payload=b""):
    """One whole frame of C{kind} holding C{payload}."""
    return FRAME_HEADER.pack(len(payload) + 1, kind) + payload


def operation_parts(sequence, operation, record, body=b"", kind=OPERATION):
    """
    The pieces of an operation frame (or, with C{kind=SNAPSHOT}, a snapshot's),
    to be written in order: the headers and record in one bytes, the body
    (shared, not copied) apart.
    """
    size = OPERATION_HEADER.size + len(record) + len(body)
    head = _OPERATION_FRAME_HEADER.pack(size + 1, kind, sequence, operation, len(record)) + record
    return (head, body) if body else (head,)


# A frame's header and an operation's, packed at once.
_OPERATION_FRAME_HEADER = struct.Struct(">IBQBI")


# An operation frame's bytes besides its record and body.
OPERATION_FRAME_OVERHEAD = _OPERATION_FRAME_HEADER.size


def pack_operation_into(buffer, offset, sequence, operation, record, body=b""):
    """
    Write the operation frame L{operation_parts} gives, joined, into C{buffer} (a writable
    memoryview with room for the frame: C{OPERATION_FRAME_OVERHEAD} bytes more than
    the record and body) at C{offset}; returns the offset after it.
    """
    end = _pack_head_into(buffer, offset, sequence, operation, record, len(body))
    if body:
        offset, end = end, end + len(body)
        buffer[offset:end] = body
    return end


def run_size(bodies, body_bytes):
    """The bytes of an append run's frame body: C{bodies}, C{body_bytes} in all, and lengths."""
    return body_bytes + BODY_LENGTH.size * len(bodies)


def pack_run_into(buffer, offset, sequence, record, bodies, body_bytes):
    """
    Write the append run frame of C{bodies} (C{body_bytes} in all) into C{buffer}, each body
    after its length, copied once, as L{pack_operation_into} does; returns the offset after it.
    """
    offset = _pack_head_into(buffer, offset, sequence, APPEND_RUN, record,
                             run_size(bodies, body_bytes))
    pack = BODY_LENGTH.pack_into
    for body in bodies:
        pack(buffer, offset, len(body))
        offset += BODY_LENGTH.size
        end = offset + len(body)
        buffer[offset:end] = body
        offset = end
    return offset


def _pack_head_into(buffer, offset, sequence, operation, record, body_size):
    _OPERATION_FRAME_HEADER.pack_into(
        buffer, offset, 1 + OPERATION_HEADER.size + len(record) + body_size,
        OPERATION, sequence, operation, len(record))
    offset += _OPERATION_FRAME_HEADER.size
    end = offset + len(record)
    buffer[offset:end] = record
    return end


def split_run(data, sequence):
    """
    The bodies of an append run's frame body C{data}, checked whole before any is used;
    raises L{StreamError} naming the fault.
    """
    bodies, offset, size = [], 0, len(data)
    unpack = BODY_LENGTH.unpack_from
    while offset < size:
        if offset + BODY_LENGTH.size > size:
            raise StreamError(f"append run at sequence {sequence} ends inside a body's length")
        (length,) = unpack(data, offset)
        offset += BODY_LENGTH.size
        end = offset + length
        if end > size:
            raise StreamError(f"append run at sequence {sequence}: a body of {length} bytes"
                              f" overruns its frame")
        bodies.append(data[offset:end])
        offset = end
    if not bodies:
        raise StreamError(f"append run at sequence {sequence} holds no message")
    return bodies


def decode_operation(payload):
    """
    C{(sequence, operation code, ReplicatedOperation, body)} from an operation
    frame's payload; raises L{StreamError} naming the fault.
    """
    sequence, operation, record, body = split_operation(payload)
    return sequence, operation, parse_record(record, operation, sequence), body


def split_operation(payload):
    """
    C{(sequence, operation code, serialised record, body)} from an operation
    frame's payload, the record not parsed (see L{parse_record}); raises
    L{StreamError} naming the fault.
    """
    if len(payload) < OPERATION_HEADER.size:
        raise StreamError(f"operation frame of {len(payload)} bytes is shorter than its header")
    sequence, operation, record_size = OPERATION_HEADER.unpack_from(payload)
    if operation not in OPERATIONS:
        raise StreamError(f"unknown operation code {operation} at sequence {sequence}")
    end = OPERATION_HEADER.size + record_size
    if end > len(payload):
        raise StreamError(f"operation record of {record_size} bytes overruns its frame"
                          f" ({len(payload)} bytes) at sequence {sequence}")
    return sequence, operation, payload[OPERATION_HEADER.size:end], payload[end:]


def parse_record(data, operation, sequence):
    """The C{ReplicatedOperation} serialised in C{data}; raises L{StreamError} naming the fault."""
    record = replication_pb2.ReplicatedOperation()
    try:
        record.ParseFromString(data)
    except Exception as problem:  # protobuf's DecodeError, or a nested-depth error
        raise StreamError(f"undecodable {OPERATIONS[operation]} record at sequence {sequence}:"
                          f" {problem}") from None
    return record


def pack_name(text):
    """A short UTF-8 string with its u8 length."""
    data = text.encode("utf-8")
    if len(data) > NAME_LIMIT:
        raise ValueError(f"{text[:40]!r}... is longer than {NAME_LIMIT} bytes")
    return bytes([len(data)]) + data


def unpack_name(payload, offset, what):
    """C{(text, next offset)} of a L{pack_name} string; raises L{StreamError}."""
    if offset >= len(payload):
        raise StreamError(f"{what} is missing")
    size = payload[offset]
    end = offset + 1 + size
    if end > len(payload):
        raise StreamError(f"{what} of {size} bytes overruns its frame")
    try:
        return bytes(payload[offset + 1:end]).decode("utf-8"), end
    except UnicodeDecodeError:
        raise StreamError(f"{what} is not UTF-8") from None


def encode_auth(nonce, mac, epoch, sequence, flags, cluster_id, node_name):
    """The payload of a follower's auth frame."""
    return (nonce + mac + POSITION.pack(epoch, sequence, flags) + pack_name(cluster_id)
            + pack_name(node_name))


def decode_auth(payload):
    """C{(nonce, mac, epoch, sequence, flags, cluster id, node name)} of an auth frame."""
    fixed = NONCE_SIZE + MAC_SIZE + POSITION.size
    if len(payload) < fixed:
        raise StreamError(f"auth frame of {len(payload)} bytes is shorter than {fixed}")
    nonce = bytes(payload[:NONCE_SIZE])
    mac = bytes(payload[NONCE_SIZE:NONCE_SIZE + MAC_SIZE])
    epoch, sequence, flags = POSITION.unpack_from(payload, NONCE_SIZE + MAC_SIZE)
    cluster, offset = unpack_name(payload, fixed, "cluster id")
    node, offset = unpack_name(payload, offset, "node name")
    if offset != len(payload):
        raise StreamError(f"auth frame has {len(payload) - offset} bytes after its fields")
    return nonce, mac, epoch, sequence, flags, cluster, node


def pack_history(history):
    """A leader's history, C{((epoch, end sequence), ...)}, with its u8 count."""
    history = tuple(history)[:HISTORY_LIMIT]
    return bytes([len(history)]) + b"".join(EPOCH_END.pack(*entry) for entry in history)


def unpack_history(payload, offset):
    """C{(history, next offset)} of a L{pack_history}; raises L{StreamError}."""
    if offset >= len(payload):
        raise StreamError("history is missing")
    count = payload[offset]
    end = offset + 1 + count * EPOCH_END.size
    if count > HISTORY_LIMIT or end > len(payload):
        raise StreamError(f"history of {count} epochs overruns its frame")
    history = tuple(EPOCH_END.unpack_from(payload, offset + 1 + index * EPOCH_END.size)
                    for index in range(count))
    return history, end


def encode_welcome(mac, epoch, history, cluster_id):
    """The payload of a leader's welcome frame."""
    return mac + SEQUENCE.pack(epoch) + pack_history(history) + pack_name(cluster_id)


def decode_welcome(payload):
    """C{(mac, epoch, history, cluster id)} of a welcome frame; raises L{StreamError}."""
    fixed = MAC_SIZE + SEQUENCE.size
    if len(payload) < fixed:
        raise StreamError(f"welcome frame of {len(payload)} bytes is too short")
    (epoch,) = SEQUENCE.unpack_from(payload, MAC_SIZE)
    history, offset = unpack_history(payload, fixed)
    cluster, offset = unpack_name(payload, offset, "cluster id")
    if offset != len(payload):
        raise StreamError(f"welcome frame has {len(payload) - offset} bytes after its fields")
    return bytes(payload[:MAC_SIZE]), epoch, history, cluster


def decode_sequence(kind, payload):
    """The one u64 of an ack or snapshot-end frame; raises L{StreamError}."""
    if len(payload) != SEQUENCE.size:
        raise StreamError(f"{KINDS[kind]} frame of {len(payload)} bytes, not {SEQUENCE.size}")
    return SEQUENCE.unpack(payload)[0]


class FrameDecoder:
    """
    Splits received bytes into C{(kind, payload)} frames. A frame's declared
    length is checked against L{limit} (which the owner may raise once the
    peer has authenticated) before its bytes are kept; every byte is looked at
    once, and the buffer is trimmed once per call, so decoding is linear.
    """

    def __init__(self, limit=HANDSHAKE_FRAME_LIMIT):
        self.limit = limit
        self._buffer = bytearray()

    def feed(self, data):
        """
        Keep C{data} and iterate over the whole frames it completes, as
        C{(kind, payload bytes)}, one at a time, so that a change of L{limit}
        made between two frames applies to the next; raises L{StreamError}
        on a length over the cap, an empty frame or an unknown kind.
        """
        self._buffer += data
        return self._frames()

    def _frames(self):
        buffer, offset = self._buffer, 0
        view = memoryview(buffer)
        try:
            while len(buffer) - offset >= FRAME_HEADER.size:
                size, kind = FRAME_HEADER.unpack_from(buffer, offset)
                if size < 1:
                    raise StreamError("frame declares length 0")
                if size - 1 > self.limit:
                    raise StreamError(f"frame declares {size - 1} bytes, over the limit of"
                                      f" {self.limit}")
                if kind not in KINDS:
                    raise StreamError(f"unknown frame kind {kind}")
                end = offset + FRAME_HEADER.size - 1 + size
                if end > len(buffer):
                    break
                payload = bytes(view[offset + FRAME_HEADER.size:end])
                offset = end
                yield kind, payload
        finally:
            view.release()
            if offset:
                del buffer[:offset]

    def buffered(self):
        """How many received bytes wait for the rest of their frame."""
        return len(self._buffer)
