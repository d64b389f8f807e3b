"""The client side of the crash tests: publishes and consumes until the broker dies.

    python -m benchmarks.crash_client --port PORT --queue Q --out DIR --run 1 --seed 7

Run as its own process by L{benchmarks.crash_loop} (and so by
tests/test_crash_recovery.py) while the broker is SIGKILLed under it: what it
knows must outlive the broker's death, and it must not share the test's process
so that nothing it does can keep the broker's sockets alive.

It opens one connection per publisher and one consumer connection:

  - each publisher sends persistent messages (delivery mode 2) of mixed sizes
    to the durable queue Q with publisher confirms, at most --window
    unconfirmed, and appends every confirmed (or nacked) range to
    ``DIR/confirmed.log`` as soon as the confirm arrives;
  - the consumer (started once --consume-after publishes are confirmed, so
    that a backlog builds up) consumes Q with manual acks, acks most deliveries and holds a
    few unacked. Its channel is in confirm mode too: after each batch of acks it
    publishes a small persistent marker to the durable queue ``Q.markers``. The
    broker commits acks and appends in arrival order, so once the marker is
    confirmed the acks sent before it are durable; only then is the batch
    written to ``DIR/acked.log``. Every ack is also written to
    ``DIR/acks-sent.log`` before it is sent: a message acked but not yet
    known durable may or may not come back after a crash (its ack may have
    ridden on any later commit), one never acked must.

Both files are line-buffered and flushed per line. Every message body carries
its id and a checksum (L{make_body}), checked on every delivery.

On stdout it prints ``progress CONFIRMED ACKED DELIVERED`` lines as those counts
grow (the crash loop kills the broker when CONFIRMED reaches its target) and,
last, one JSON line with what it sent, what it saw and why it stopped: the
broker going away (the expected end) or having published and consumed
everything.
"""

import argparse
import json
import pathlib
import random
import struct
import sys
import zlib

from pamqp import commands

from benchmarks.amqp_client import (
    BASIC_ACK,
    BASIC_DELIVER,
    BASIC_NACK,
    BASIC_PUBLISH,
    CONFIRM_ARGUMENTS,
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_START,
    LONG_LONG,
    METHOD_INDEX,
    BenchmarkError,
    Connection,
    Loop,
    frame,
    short_string,
)

# -- message bodies: id, payload, checksum

MAGIC = b"CRSH"
BODY_HEAD = struct.Struct(">4sIHQI")  # magic, run, publisher, sequence, payload length
CHECKSUM = struct.Struct(">I")
CONTENT_TYPE = "application/x-brokerd-crash"
# Property flags: content-type (bit 15) and delivery-mode (bit 12) present; mode 2 = persistent.
PERSISTENT_PROPERTIES = struct.pack(">H", 0x9000) + short_string(CONTENT_TYPE) + b"\x02"
MARKER_PUBLISHER = 0xFFFF  # the publisher number in the id of consumer markers


class CorruptBody(ValueError):
    """A body that is not one L{make_body} built, or whose checksum does not match."""


def make_body(run, publisher, sequence, payload):
    """A body naming message C{(run, publisher, sequence)}, carrying C{payload}, ending in a CRC-32."""
    head = BODY_HEAD.pack(MAGIC, run, publisher, sequence, len(payload))
    return head + payload + CHECKSUM.pack(zlib.crc32(payload, zlib.crc32(head)))


def parse_body(body):
    """The C{(run, publisher, sequence)} id of a L{make_body} body; raises L{CorruptBody} if damaged."""
    if len(body) < BODY_HEAD.size + CHECKSUM.size:
        raise CorruptBody(f"body of {len(body)} bytes is shorter than the id and checksum")
    magic, run, publisher, sequence, length = BODY_HEAD.unpack_from(body)
    if magic != MAGIC:
        raise CorruptBody(f"body starts with {bytes(body[:4])!r}, not {MAGIC!r}")
    if len(body) != BODY_HEAD.size + length + CHECKSUM.size:
        raise CorruptBody(
            f"message {run}:{publisher}:{sequence}: body of {len(body)} bytes, its header says"
            f" {BODY_HEAD.size + length + CHECKSUM.size}"
        )
    (expected,) = CHECKSUM.unpack_from(body, len(body) - CHECKSUM.size)
    actual = zlib.crc32(memoryview(body)[: len(body) - CHECKSUM.size])
    if actual != expected:
        raise CorruptBody(f"message {run}:{publisher}:{sequence}: CRC-32 {actual:#010x}, body says {expected:#010x}")
    return run, publisher, sequence


def payload_size(rng):
    """Mostly small bodies, some of a few KiB, and a few spanning several 128 KiB frames."""
    draw = rng.random()
    if draw < 0.05:
        return rng.randint(64 * 1024, 320 * 1024)
    if draw < 0.20:
        return rng.randint(1024, 16 * 1024)
    return rng.randint(0, 400)


def format_id(message_id):
    return "%d:%d:%d" % message_id


def parse_id(text):
    run, publisher, sequence = text.split(":")
    return int(run), int(publisher), int(sequence)


class BrokerGone(Exception):
    """The broker closed or reset the connection: in a crash test, it was killed."""


# -- a connection that assembles whole deliveries on any channel


class CrashConnection(Connection):
    """
    An L{amqp_client.Connection} that hands whole deliveries (with their
    encoded properties and full body) and publisher confirms of any channel to
    the callbacks C{on_delivery(channel, delivery_tag, redelivered, properties,
    body)} and C{on_confirm(channel, delivery_tag, multiple, ack)}, calls
    C{after_read()} once per read, and turns a closed or reset socket into
    L{BrokerGone}.
    """

    def __init__(self, loop, host, port, name):
        self.on_delivery = self._no_delivery
        self.on_confirm = self._no_confirm
        self.after_read = lambda: None
        self._contents = {}  # channel -> [delivery tag, redelivered, properties, body pieces, bytes left]
        super().__init__(loop, host, port, name)

    def _no_delivery(self, channel, delivery_tag, *_):
        raise BenchmarkError(f"{self.name}: delivery {delivery_tag} on channel {channel} with no consumer")

    def _no_confirm(self, channel, delivery_tag, *_):
        raise BenchmarkError(f"{self.name}: confirm {delivery_tag} on channel {channel} with no publisher")

    def write(self, data):
        try:
            super().write(data)
        except OSError as error:
            raise BrokerGone(f"{self.name}: {error}") from None

    def on_writable(self):
        try:
            super().on_writable()
        except OSError as error:
            raise BrokerGone(f"{self.name}: {error}") from None

    def on_readable(self):
        try:
            data = self.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError as error:
            raise BrokerGone(f"{self.name}: {error}") from None
        if not data:
            raise BrokerGone(f"{self.name}: the broker closed the connection")
        if self.pending:
            data = self.pending + data
        offset = self._frames(data)
        self.pending = data[offset:] if offset < len(data) else b""
        self.after_read()

    def _frames(self, data):
        size = len(data)
        offset = 0
        contents = self._contents
        while size - offset >= 7:
            frame_type, channel, length = FRAME_START.unpack_from(data, offset)
            start = offset + 7
            end = start + length
            if end >= size:
                break
            if data[end] != FRAME_END:
                raise BenchmarkError(f"{self.name}: frame end byte is {data[end]:#04x}, not 0xce")
            if frame_type == FRAME_BODY:
                content = contents.get(channel)
                if content is None or content[4] < length:
                    raise BenchmarkError(f"{self.name}: unexpected body frame on channel {channel}")
                content[3].append(data[start:end])
                content[4] -= length
                if content[4] == 0:
                    self._complete(channel)
            elif frame_type == FRAME_METHOD:
                (index,) = METHOD_INDEX.unpack_from(data, start)
                if index == BASIC_DELIVER:
                    if channel in contents:
                        raise BenchmarkError(f"{self.name}: basic.deliver before the last content was complete")
                    tag_at = start + 5 + data[start + 4]
                    (delivery_tag,) = LONG_LONG.unpack_from(data, tag_at)
                    contents[channel] = [delivery_tag, bool(data[tag_at + 8] & 1), None, [], None]
                elif index == BASIC_ACK or index == BASIC_NACK:
                    delivery_tag, flags = CONFIRM_ARGUMENTS.unpack_from(data, start + 4)
                    self.on_confirm(channel, delivery_tag, bool(flags & 1), index == BASIC_ACK)
                else:
                    self._method(data[offset : end + 1])
            elif frame_type == FRAME_HEADER:
                content = contents.get(channel)
                if content is None or content[2] is not None:
                    raise BenchmarkError(f"{self.name}: unexpected content header on channel {channel}")
                (body_size,) = LONG_LONG.unpack_from(data, start + 4)
                content[2] = bytes(data[start + 12 : end])
                content[4] = body_size
                if body_size == 0:
                    self._complete(channel)
            elif frame_type != FRAME_HEARTBEAT:
                raise BenchmarkError(f"{self.name}: unknown frame type {frame_type}")
            offset = end + 1
        return offset

    def _complete(self, channel):
        delivery_tag, redelivered, properties, pieces, _ = self._contents.pop(channel)
        self.on_delivery(channel, delivery_tag, redelivered, properties, b"".join(pieces))

    def publish(self, routing_key, body, channel=Connection.CHANNEL, properties=PERSISTENT_PROPERTIES):
        """Writes one basic.publish to the default exchange (no confirm bookkeeping)."""
        self.write(publish_frames(channel, routing_key, body, properties, self.frame_max))

    def ack(self, delivery_tag, multiple=False, channel=Connection.CHANNEL):
        self.write(
            FRAME_START.pack(FRAME_METHOD, channel, 13)
            + METHOD_INDEX.pack(BASIC_ACK)
            + LONG_LONG.pack(delivery_tag)
            + (b"\x01" if multiple else b"\x00")
            + bytes((FRAME_END,))
        )


def publish_frames(channel, routing_key, body, properties, frame_max):
    """The frames of one basic.publish of C{body} to the default exchange."""
    method = frame(
        FRAME_METHOD,
        channel,
        METHOD_INDEX.pack(BASIC_PUBLISH) + b"\x00\x00" + short_string("") + short_string(routing_key) + b"\x00",
    )
    header = frame(FRAME_HEADER, channel, struct.pack(">HHQ", 60, 0, len(body)) + properties)
    largest = frame_max - 8
    bodies = [frame(FRAME_BODY, channel, body[at : at + largest]) for at in range(0, len(body), largest)]
    return b"".join([method, header, *bodies])


def check_properties(properties):
    """None if C{properties} are the ones every crash-test message is published with, else what differs."""
    if properties == PERSISTENT_PROPERTIES:
        return None
    return f"content properties {properties!r}, published as {PERSISTENT_PROPERTIES!r}"


# -- the roles


class Publisher:
    """
    Publishes messages C{(run, number, 1..count)} with confirms, at most
    C{window} unanswered, and logs every answered range to C{record} as
    ``C number first last`` (confirmed) or ``N number first last`` (nacked).
    """

    def __init__(self, connection, run, number, queue, count, window, rng, record):
        self.connection = connection
        self.run = run
        self.number = number
        self.queue = queue
        self.count = count
        self.window = window
        self.rng = rng
        self.record = record
        self.sent = 0
        self.answered = 0  # every sequence up to this one was confirmed or nacked
        self.confirmed = 0
        self.nacked = 0
        self.problems = []

    def start(self):
        self.connection.rpc(commands.Confirm.Select(), commands.Confirm.SelectOk)
        self.connection.on_confirm = self.on_confirm
        self._fill()

    @property
    def done(self):
        return self.answered == self.count

    def _fill(self):
        room = min(self.window - (self.sent - self.answered), self.count - self.sent)
        if room <= 0:
            return
        pieces = []
        rng, frame_max = self.rng, self.connection.frame_max
        for sequence in range(self.sent + 1, self.sent + room + 1):
            body = make_body(self.run, self.number, sequence, rng.randbytes(payload_size(rng)))
            pieces.append(publish_frames(Connection.CHANNEL, self.queue, body, PERSISTENT_PROPERTIES, frame_max))
        self.sent += room
        self.connection.write(b"".join(pieces))

    def on_confirm(self, channel, delivery_tag, multiple, ack):
        first = self.answered + 1 if multiple else delivery_tag
        if first != self.answered + 1 or delivery_tag > self.sent or delivery_tag < first:
            self.problems.append(
                f"publisher {self.number}: confirm for tag {delivery_tag} (multiple={multiple}) after"
                f" {self.answered} answered of {self.sent} sent"
            )
            raise BenchmarkError(self.problems[-1])
        self.answered = delivery_tag
        if ack:
            self.confirmed += delivery_tag - first + 1
        else:
            self.nacked += delivery_tag - first + 1
        self.record.write(f"{'C' if ack else 'N'} {self.number} {first} {delivery_tag}\n")
        self._fill()


class Consumer:
    """
    Consumes C{queue}, checking every body, and acks most deliveries (holding
    about one in thirty unacked, at most a quarter of C{prefetch}). Each read's
    acks are followed by a persistent marker published to C{marker_queue} on
    the same channel; when the marker is confirmed the batch is durable and is
    logged to C{record} as ``A MARKER ID ID...``. Before the acks are sent
    they are logged to C{sent_record} as ``S MARKER ID ID...``.
    """

    def __init__(self, connection, run, queue, marker_queue, prefetch, rng, record, sent_record):
        self.connection = connection
        self.run = run
        self.queue = queue
        self.marker_queue = marker_queue
        self.prefetch = prefetch
        self.rng = rng
        self.record = record
        self.sent_record = sent_record
        self.delivered = 0
        self.held = []
        self.to_ack = []
        self.markers_sent = 0
        self.batches = {}  # marker sequence -> ids acked before it
        self.acked_durable = 0
        self.corrupt = []
        self.problems = []
        self.seen = set()

    def start(self):
        connection = self.connection
        connection.on_delivery = self.on_delivery
        connection.on_confirm = self.on_confirm
        connection.after_read = self.after_read
        connection.rpc(commands.Basic.Qos(prefetch_count=self.prefetch), commands.Basic.QosOk)
        connection.rpc(commands.Confirm.Select(), commands.Confirm.SelectOk)
        connection.rpc(commands.Basic.Consume(queue=self.queue), commands.Basic.ConsumeOk)

    def on_delivery(self, channel, delivery_tag, redelivered, properties, body):
        self.delivered += 1
        try:
            message_id = parse_body(body)
        except CorruptBody as problem:
            self.corrupt.append(f"delivery {delivery_tag}: {problem}")
            self.connection.ack(delivery_tag)  # out of the way; the run fails anyway
            return
        wrong = check_properties(properties)
        if wrong:
            self.corrupt.append(f"message {format_id(message_id)}: {wrong}")
        if message_id in self.seen:
            self.problems.append(f"message {format_id(message_id)} delivered twice without a restart")
        self.seen.add(message_id)
        if self.rng.random() < 1 / 30 and len(self.held) < self.prefetch // 4:
            self.held.append(message_id)
        else:
            self.to_ack.append((delivery_tag, message_id))

    def after_read(self):
        if not self.to_ack:
            return
        batch, self.to_ack = self.to_ack, []
        connection = self.connection
        self.markers_sent += 1
        ids = self.batches[self.markers_sent] = [message_id for _, message_id in batch]
        self.sent_record.write(f"S {self.markers_sent} {' '.join(map(format_id, ids))}\n")
        connection.write(b"".join(_ack_frame(tag) for tag, _ in batch))
        marker = make_body(self.run, MARKER_PUBLISHER, self.markers_sent, b"")
        connection.publish(self.marker_queue, marker)

    def on_confirm(self, channel, delivery_tag, multiple, ack):
        if multiple:
            sequences = sorted(sequence for sequence in self.batches if sequence <= delivery_tag)
        else:
            sequences = [delivery_tag] if delivery_tag in self.batches else []
        if not sequences:
            self.problems.append(f"marker confirm {delivery_tag} (multiple={multiple}) answers no marker")
            raise BenchmarkError(self.problems[-1])
        for sequence in sequences:
            ids = self.batches.pop(sequence)
            if ack:  # a nacked marker proves nothing: its batch may or may not be durable
                self.record.write(f"A {sequence} {' '.join(map(format_id, ids))}\n")
                self.acked_durable += len(ids)

    @property
    def settled(self):
        return not self.batches and not self.to_ack


def _ack_frame(delivery_tag):
    return (
        FRAME_START.pack(FRAME_METHOD, Connection.CHANNEL, 13)
        + METHOD_INDEX.pack(BASIC_ACK)
        + LONG_LONG.pack(delivery_tag)
        + b"\x00"
        + bytes((FRAME_END,))
    )


def run(options):
    """Publishes and consumes until the broker goes away or all is done; returns the summary dict."""
    out = pathlib.Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    confirmed_log = open(out / "confirmed.log", "a", buffering=1)
    acked_log = open(out / "acked.log", "a", buffering=1)
    sent_log = open(out / "acks-sent.log", "a", buffering=1)
    loop = Loop()
    publishers, consumer, connections = [], None, []
    summary = {"run": options.run, "ended": None, "detail": None}
    try:
        for number in range(1, options.publishers + 1):
            connection = CrashConnection(loop, options.host, options.port, f"crash-publisher-{number}")
            connections.append(connection)
            connection.open()
            rng = random.Random(f"{options.seed}/{options.run}/{number}")
            publishers.append(
                Publisher(connection, options.run, number, options.queue, options.messages, options.window, rng,
                          confirmed_log)
            )
        connection = CrashConnection(loop, options.host, options.port, "crash-consumer")
        connections.append(connection)
        connection.open()
        consumer = Consumer(connection, options.run, options.queue, options.queue + ".markers", options.prefetch,
                            random.Random(f"{options.seed}/{options.run}/consumer"), acked_log, sent_log)
        for publisher in publishers:
            publisher.start()
        total = options.publishers * options.messages
        last = [None]

        def progress():
            now = (sum(p.confirmed for p in publishers), consumer.acked_durable, consumer.delivered)
            if now != last[0]:
                last[0] = now
                print("progress %d %d %d" % now, flush=True)
            return now

        def backlog_built():
            progress()
            return all(p.done for p in publishers) or last[0][0] >= options.consume_after

        def done():
            progress()
            return (all(p.done for p in publishers) and consumer.delivered >= total - sum(p.nacked for p in publishers)
                    and consumer.settled)

        loop.run_until(backlog_built, lambda: f"crash client before consuming, progress {last[0]}", progress)
        consumer.start()
        loop.run_until(done, lambda: f"crash client, progress {last[0]}", progress)
        summary["ended"] = "finished"
    except BrokerGone as gone:
        summary["ended"] = "broker-gone"
        summary["detail"] = str(gone)
    except BenchmarkError as error:
        summary["ended"] = "error"
        summary["detail"] = str(error)
    finally:
        for connection in connections:
            connection.shut()
        confirmed_log.close()
        acked_log.close()
        sent_log.close()
    summary["publishers"] = {
        p.number: {"sent": p.sent, "confirmed": p.confirmed, "nacked": p.nacked} for p in publishers
    }
    if consumer is not None:
        summary.update(
            delivered=consumer.delivered,
            acked_durable=consumer.acked_durable,
            held=len(consumer.held),
            markers=consumer.markers_sent,
            corrupt=consumer.corrupt,
            problems=consumer.problems + [problem for p in publishers for problem in p.problems],
        )
    return summary


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--queue", required=True, help="durable queue to publish to and consume from")
    parser.add_argument("--out", required=True, help="directory for confirmed.log, acked.log and acks-sent.log")
    parser.add_argument("--run", type=int, default=1, help="run number, part of every message id")
    parser.add_argument("--seed", default="0", help="seeds message sizes, payloads and which deliveries are held")
    parser.add_argument("--publishers", type=int, default=2)
    parser.add_argument("--messages", type=int, default=100_000, help="per publisher")
    parser.add_argument("--window", type=int, default=300, help="most unconfirmed publishes per publisher")
    parser.add_argument("--prefetch", type=int, default=200)
    parser.add_argument("--consume-after", type=int, default=0, help="start consuming after this many confirms")
    return parser


def main(argv=None):
    summary = run(build_parser().parse_args(argv))
    print(json.dumps(summary), flush=True)
    return 0 if summary["ended"] in ("finished", "broker-gone") else 1


if __name__ == "__main__":
    sys.exit(main())
