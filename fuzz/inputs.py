"""The fuzzer's inputs, one seeded stream: random frames, mutated valid
conversations and structured hostile inputs, in AMQP 0-9-1 and the native protocol.

L{InputStream} draws every choice from one C{random.Random(seed)}, never from
the broker's answers, so the same seed (and volume) gives the same inputs in the
same order. Hostile inputs with named intents live in L{fuzz.hostile}.
"""

import dataclasses
import hashlib
import random
import struct

from brokerd.proto.native_pb2 import Envelope
from fuzz import hostile, wire
from fuzz.canary import SHARED_QUEUE

PROTOCOLS = ("amqp", "native")
FAMILY_WEIGHTS = (("random", 3), ("mutated", 4), ("hostile", 3))
SEND_SECONDS = 1.0  # how long sending one input may take, unless the input says otherwise
INTERESTING_32 = (0, 1, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF)


@dataclasses.dataclass
class Input:
    """One hostile input: C{chunks} go over a fresh socket, after a guest login when C{login}."""

    index: int
    protocol: str
    kind: str  # "amqp/random", "native/mutated", "amqp/deep-arguments", ...
    detail: str
    chunks: list
    login: bool = False
    send_seconds: float = SEND_SECONDS
    read_while_sending: bool = True  # False: a client that never reads while it sends
    connections: int = 1  # more: the same chunks over that many sockets, all held open until the last is sent

    @property
    def size(self):
        return sum(len(chunk) for chunk in self.chunks)

    def digest(self):
        content = hashlib.sha256()
        for chunk in self.chunks:
            content.update(struct.pack(">Q", len(chunk)))
            content.update(chunk)
        return f"{self.kind}|{self.login}|{self.connections}|{self.detail}|{content.hexdigest()}"

    def describe(self):
        login = " after guest login" if self.login else ""
        sockets = f" on each of {self.connections} connections" if self.connections > 1 else ""
        return f"input #{self.index} {self.kind}{login}: {self.detail} ({self.size} bytes{sockets})"


class InputStream:
    """Seeded inputs; C{volume} scales the resource-abuse ones (bytes they push at the broker)."""

    def __init__(self, seed, volume=256 << 20):
        self.rng = random.Random(seed)
        self.volume = volume
        self.index = 0
        self.amqp_corpus = amqp_corpus()
        self.native_corpus = native_corpus()

    def __iter__(self):
        return self

    def __next__(self):
        rng = self.rng
        protocol = rng.choice(PROTOCOLS)
        family = rng.choices([name for name, _ in FAMILY_WEIGHTS], [weight for _, weight in FAMILY_WEIGHTS])[0]
        if family == "hostile":
            made = hostile.make(rng, protocol, self.volume)
            kind = f"{protocol}/{made.pop('name')}"
        else:
            maker = getattr(self, f"_{family}_{protocol}")
            made = maker(rng)
            kind = f"{protocol}/{family}"
        self.index += 1
        return Input(index=self.index, protocol=protocol, kind=kind, **made)

    # -- random frames

    def _random_amqp(self, rng):
        login = rng.random() < 0.5
        chunks = [] if login else [wire.PROTOCOL_HEADER if rng.random() < 0.8 else random_bytes(rng, 8)]
        if login:
            chunks.append(wire.channel_open(1))
        for _ in range(rng.randint(1, 12)):
            chunks.append(random_amqp_frame(rng))
        return dict(chunks=chunks, login=login, detail=f"{len(chunks)} random frames")

    def _random_native(self, rng):
        login = rng.random() < 0.5
        chunks = [wire.native_frame(wire.envelope("channel_open", 1, 1))] if login else []
        for _ in range(rng.randint(1, 12)):
            if rng.random() < 0.6:
                data = random_envelope(rng).SerializeToString()
            else:
                data = random_bytes(rng, rng.choice((0, 1, 5, 16, 64)))
            prefix = len(data) if rng.random() < 0.85 else rng.choice(INTERESTING_32)
            chunks.append(struct.pack(">I", prefix) + data)
        return dict(chunks=chunks, login=login, detail=f"{len(chunks)} random envelopes/frames")

    # -- mutated conversations

    def _mutated_amqp(self, rng):
        frames = list(self.amqp_corpus)
        notes = mutate(rng, frames, self.amqp_corpus, amqp_length_at=3, prefix_size=7)
        return dict(chunks=[b"".join(frames)], detail=", ".join(notes))

    def _mutated_native(self, rng):
        frames = list(self.native_corpus)
        notes = []
        if rng.random() < 0.4:
            at = rng.randrange(1, len(frames))
            frames[at] = mutate_envelope_field(rng, frames[at])
            notes.append(f"field change in frame {at}")
        rounds = rng.randint(0 if notes else 1, 3)
        notes += mutate(rng, frames, self.native_corpus, amqp_length_at=0, prefix_size=4, rounds=rounds)
        return dict(chunks=[b"".join(frames)], detail=", ".join(notes))


# -- the valid conversations


def amqp_corpus():
    """A whole valid AMQP conversation as guest, one frame per item (the protocol header first)."""
    headers = {"x-trace": "a", "n": 7, "ok": True, "f": 1.5, "nested": {"k": [1, "two", None]}, "b": b"\x00\x01"}
    frames = [
        wire.PROTOCOL_HEADER,
        wire.start_ok(client_properties={"product": "fuzz", "capabilities": {"publisher_confirms": True}}),
        wire.tune_ok(2047, 131072, 0),
        wire.connection_open(),
        wire.channel_open(1),
        wire.method(1, wire.EXCHANGE_DECLARE, wire.short(0) + wire.shortstr("fuzz-x") + wire.shortstr("topic")
                    + wire.bits(False, False, False, False, False) + wire.table({"alternate-exchange": "fuzz-ae"})),
        wire.queue_declare(1, SHARED_QUEUE, durable=True),
        wire.queue_declare(1, "fuzz-q", exclusive=True,
                           arguments={"x-max-length": 1000, "x-message-ttl": 60000, "x-max-priority": 10}),
        wire.method(1, wire.QUEUE_BIND, wire.short(0) + wire.shortstr("fuzz-q") + wire.shortstr("fuzz-x")
                    + wire.shortstr("a.#") + wire.bits(False) + wire.table({"x-match": "any"})),
        wire.method(1, wire.BASIC_QOS, wire.long_(0) + wire.short(10) + wire.bits(False)),
        wire.method(1, wire.CONFIRM_SELECT, wire.bits(False)),
        *wire.publish(1, SHARED_QUEUE, b"fuzz body", {
            "content_type": "text/plain", "headers": headers, "delivery_mode": 2, "priority": 5,
            "message_id": "m-1", "timestamp": 1700000000, "expiration": "60000", "app_id": "fuzz"}),
        *wire.publish(1, "a.b", b"x" * 300, {"delivery_mode": 1}, exchange="fuzz-x"),
        wire.basic_get(1, "fuzz-q"),
        wire.basic_ack(1, 1),
        wire.method(1, wire.BASIC_CONSUME, wire.short(0) + wire.shortstr("fuzz-q") + wire.shortstr("ctag")
                    + wire.bits(False, False, False, False) + wire.table({"x-priority": 1})),
        wire.method(1, wire.BASIC_CANCEL, wire.shortstr("ctag") + wire.bits(False)),
        wire.method(1, wire.BASIC_REJECT, wire.longlong(2) + wire.bits(True)),
        wire.method(1, wire.BASIC_NACK, wire.longlong(0) + wire.bits(True, True)),
        wire.method(1, wire.BASIC_RECOVER, wire.bits(True)),
        wire.channel_open(2),
        wire.method(2, wire.TX_SELECT),
        *wire.publish(2, "fuzz-q", b"in a transaction", {"headers": {"t": 1}}),
        wire.method(2, wire.TX_COMMIT),
        wire.method(2, wire.TX_ROLLBACK),
        wire.method(1, wire.QUEUE_PURGE, wire.short(0) + wire.shortstr("fuzz-q") + wire.bits(False)),
        wire.method(1, wire.CHANNEL_CLOSE, wire.short(200) + wire.shortstr("done") + wire.short(0) + wire.short(0)),
        wire.connection_close(),
    ]
    return tuple(frames)


def native_corpus():
    """A whole valid native conversation, one length-prefixed envelope per item (hello first)."""
    headers = {"x-trace": "a", "n": 7, "ok": True, "f": 1.5, "nested": {"k": [1, "two", None]}}
    properties = dict(delivery_mode=2, content_type="text/plain", priority=5, message_id="m-1", timestamp=1700000000,
                      expiration="60000", app_id="fuzz", headers=headers)
    items = [
        wire.native_hello(),
        wire.envelope("channel_open", 1, 1),
        wire.envelope("exchange_declare", 1, 2, exchange="fuzz-x", type=3,
                      arguments={"alternate-exchange": "fuzz-ae"}),
        wire.envelope("queue_declare", 1, 3, queue=SHARED_QUEUE, durable=True),
        wire.envelope("queue_declare", 1, 4, queue="fuzz-nq", exclusive=True,
                      arguments={"x-max-length": 1000, "x-max-priority": 10}),
        wire.envelope("queue_bind", 1, 5, queue="fuzz-nq", exchange="fuzz-x", routing_key="a.#",
                      arguments={"x-match": "any"}),
        wire.envelope("basic_qos", 1, 6, prefetch_count=10),
        wire.envelope("confirm_select", 1, 7),
        wire.envelope("basic_publish", 1, 0, routing_key=SHARED_QUEUE, body=b"fuzz body", properties=properties),
        wire.envelope("basic_publish", 1, 0, exchange="fuzz-x", routing_key="a.b", body=b"x" * 300),
        wire.envelope("basic_get", 1, 8, queue="fuzz-nq"),
        wire.envelope("basic_ack", 1, 0, delivery_tag=1),
        wire.envelope("basic_consume", 1, 9, queue="fuzz-nq", consumer_tag="ctag",
                      arguments={"x-priority": 1}),
        wire.envelope("basic_cancel", 1, 10, consumer_tag="ctag"),
        wire.envelope("basic_reject", 1, 0, delivery_tag=2, requeue=True),
        wire.envelope("basic_nack", 1, 0, delivery_tag=0, multiple=True, requeue=True),
        wire.envelope("basic_recover", 1, 11, requeue=True),
        wire.envelope("queue_purge", 1, 12, queue="fuzz-nq"),
        wire.envelope("channel_close", 1, 13, reply_code=200, reply_text="done"),
        wire.envelope("connection_close", 0, 14, reply_code=200),
    ]
    return tuple(wire.native_frame(item) for item in items)


# -- mutation


def random_bytes(rng, count):
    return bytes(rng.getrandbits(8) for _ in range(count))


def mutate(rng, frames, corpus, amqp_length_at, prefix_size, rounds=None):
    """Apply 1-4 seeded mutations to C{frames} in place; returns what was done, one note each."""
    notes = []
    for _ in range(rng.randint(1, 4) if rounds is None else rounds):
        at = rng.randrange(1, len(frames)) if len(frames) > 1 else 0
        frame = bytearray(frames[at])
        operation = rng.choice(("flip", "flip", "insert", "delete", "overwrite", "overwrite", "length", "length",
                                "duplicate", "drop", "swap", "splice", "truncate"))
        if operation == "flip" and frame:
            for _ in range(rng.randint(1, 4)):
                position = rng.randrange(len(frame))
                frame[position] ^= 1 << rng.randrange(8)
            notes.append(f"bit flips in frame {at}")
        elif operation == "insert":
            position = rng.randrange(len(frame) + 1)
            frame[position:position] = random_bytes(rng, rng.choice((1, 2, 4, 16)))
            notes.append(f"bytes inserted in frame {at}")
        elif operation == "delete" and frame:
            position = rng.randrange(len(frame))
            del frame[position : position + rng.choice((1, 2, 4, 16))]
            notes.append(f"bytes deleted in frame {at}")
        elif operation == "overwrite" and len(frame) > prefix_size + 4:
            position = rng.randrange(prefix_size, len(frame) - 4)
            value = rng.choice(INTERESTING_32)
            width = rng.choice((1, 2, 4))
            frame[position : position + width] = (value & ((1 << 8 * width) - 1)).to_bytes(width, "big")
            notes.append(f"{width}-byte {value:#x} written in frame {at}")
        elif operation == "length" and len(frame) >= amqp_length_at + 4:
            declared = len(frame) - prefix_size - (1 if prefix_size == 7 else 0)
            value = rng.choice((0, declared - 1, declared + 1, 0x7FFFFFFF, 0xFFFFFFFF, 1 << 28, 4097, 1 << 20))
            frame[amqp_length_at : amqp_length_at + 4] = (max(value, 0) & 0xFFFFFFFF).to_bytes(4, "big")
            notes.append(f"length of frame {at} rewritten to {value}")
        elif operation == "duplicate":
            frames.insert(at, bytes(frame))
            notes.append(f"frame {at} duplicated")
        elif operation == "drop":
            frame = bytearray()
            notes.append(f"frame {at} dropped")
        elif operation == "swap":
            other = rng.randrange(1, len(frames))
            frames[other], frame = bytes(frame), bytearray(frames[other])
            notes.append(f"frames {at} and {other} swapped")
        elif operation == "splice":
            donor = corpus[rng.randrange(1, len(corpus))]
            frames.insert(at + 1, donor)
            notes.append(f"a copy of a corpus frame spliced in after {at}")
        elif operation == "truncate":
            del frames[at + 1 :]
            frame = frame[: rng.randrange(len(frame) + 1)]
            notes.append(f"conversation truncated inside frame {at}")
        frames[at] = bytes(frame)
    return notes


# -- protobuf-aware randomness


def random_string(rng):
    choice = rng.random()
    if choice < 0.3:
        return ""
    if choice < 0.6:
        return rng.choice(("fuzz-q", SHARED_QUEUE, "amq.direct", "fuzz-x", "amq.headers", "x" * 256, "€" * 100))
    if choice < 0.8:
        return "".join(chr(rng.choice((rng.randrange(32, 127), rng.randrange(128, 0xD7FF)))) for _ in range(8))
    return "s" * rng.choice((255, 256, 300, 4096, 70000))


def random_integer(rng, field):
    unsigned = field.cpp_type in (field.CPPTYPE_UINT32, field.CPPTYPE_UINT64)
    bits = 32 if field.cpp_type in (field.CPPTYPE_UINT32, field.CPPTYPE_INT32, field.CPPTYPE_ENUM) else 64
    extremes = [0, 1, 2, 255, 256, 300, 65535, 65536, (1 << (bits - 1)) - 1]
    extremes += [(1 << bits) - 1] if unsigned else [-1, -(1 << (bits - 1))]
    return rng.choice(extremes) if rng.random() < 0.7 else rng.randrange(0, 1 << (bits - 1))


def fill_message(rng, message, depth=0):
    """Set a random subset of C{message}'s fields to random (often extreme) values, recursively."""
    descriptor = message.DESCRIPTOR
    for oneof in descriptor.oneofs:
        if not oneof.name.startswith("_") and rng.random() < 0.8:
            _fill_field(rng, message, rng.choice(list(oneof.fields)), depth)
    for field in descriptor.fields:
        if field.containing_oneof is not None and not field.containing_oneof.name.startswith("_"):
            continue
        if rng.random() < 0.5:
            _fill_field(rng, message, field, depth)


def _fill_field(rng, message, field, depth):
    if field.cpp_type == field.CPPTYPE_MESSAGE:
        if depth > 6:
            return
        if field.is_repeated:
            for _ in range(rng.choice((1, 2, 3))):
                fill_message(rng, getattr(message, field.name).add(), depth + 1)
        else:
            child = getattr(message, field.name)
            child.SetInParent()
            fill_message(rng, child, depth + 1)
        return
    if field.cpp_type == field.CPPTYPE_STRING:
        value = random_string(rng)
        value = value.encode() if field.type == field.TYPE_BYTES else value
    elif field.cpp_type == field.CPPTYPE_BOOL:
        value = rng.random() < 0.5
    elif field.cpp_type in (field.CPPTYPE_DOUBLE, field.CPPTYPE_FLOAT):
        value = rng.choice((0.0, -1.5, 1e308, float("inf"), float("nan")))
        if field.cpp_type == field.CPPTYPE_FLOAT and abs(value) == 1e308:
            value = 3e38
    else:
        value = random_integer(rng, field)
    try:
        if field.is_repeated:
            getattr(message, field.name).append(value)
        else:
            setattr(message, field.name, value)
    except (ValueError, TypeError):
        pass  # a value this field's type cannot hold: leave it unset


def random_envelope(rng):
    result = Envelope()
    fill_message(rng, result)
    if rng.random() < 0.7:
        result.channel = rng.choice((0, 1, 2, 65535, 1 << 31))
    return result


def mutate_envelope_field(rng, frame):
    """The native frame C{frame} with one random field of its envelope set to a random value."""
    parsed = Envelope()
    parsed.ParseFromString(frame[4:])
    kind = parsed.WhichOneof("payload")
    payload = getattr(parsed, kind) if kind else parsed
    if payload.DESCRIPTOR.fields:
        _fill_field(rng, payload, rng.choice(list(payload.DESCRIPTOR.fields)), 0)
    return wire.native_frame(parsed)


def random_amqp_frame(rng):
    """One random AMQP frame: random type, channel, length and payload (often a real method id)."""
    frame_type = rng.choice((1, 1, 1, 2, 3, 8, rng.randrange(256)))
    channel = rng.choice((0, 1, 1, 2, 65535, rng.randrange(65536)))
    if frame_type == 1 and rng.random() < 0.7:
        method_id = rng.choice(hostile.AMQP_METHODS)
        payload = struct.pack(">HH", *method_id) + random_bytes(rng, rng.choice((0, 1, 4, 12, 40)))
    else:
        payload = random_bytes(rng, rng.choice((0, 1, 8, 14, 64)))
    length = len(payload) if rng.random() < 0.85 else rng.choice(INTERESTING_32)
    end = wire.FRAME_END if rng.random() < 0.9 else rng.randrange(256)
    return struct.pack(">BHI", frame_type, channel, length) + payload + bytes((end,))
