"""The crash client's publishers (persistent messages with confirms) and its consumer (manual acks).

Each logs what the broker promised it, as soon as the promise arrives, to the
logs of L{crashloop.logs}.
"""

from pamqp import commands

from brokerd.loadgen.amqp_client import Connection
from brokerd.loadgen.amqp_codec import BASIC_ACK, BenchmarkError, publish_frames, settle_frame
from crashloop.body import (
    MARKER_PUBLISHER,
    PERSISTENT_PROPERTIES,
    CorruptBody,
    check_properties,
    format_id,
    make_body,
    parse_body,
    payload_size,
)
from crashloop.logs import log_acks, log_answered


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
        log_answered(self.record, ack, self.number, first, delivery_tag)
        self._fill()


class Consumer:
    """
    Consumes C{queue}, checking every body, and acks most deliveries (holding
    about one in thirty unacked, at most a quarter of C{prefetch}). Each read's
    acks are followed by a persistent marker published to C{marker_queue} on
    the same channel; when the marker is confirmed the batch is durable and is
    logged to C{record} as ``A MARKER ID ID...``. Before the acks are sent
    they are logged to C{sent_record} as ``S MARKER ID ID...``.

    The broker commits acks and appends in arrival order, so once the marker
    is confirmed the acks sent before it are durable. A message acked but not
    yet known durable may or may not come back after a crash (its ack may have
    ridden on any later commit); one never acked must.
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

    def on_delivery(self, delivery):
        delivery_tag, properties, body = delivery.delivery_tag, delivery.properties, delivery.body
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
        log_acks(self.sent_record, "S", self.markers_sent, ids)
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
                log_acks(self.record, "A", sequence, ids)
                self.acked_durable += len(ids)

    @property
    def settled(self):
        return not self.batches and not self.to_ack


def _ack_frame(delivery_tag):
    return settle_frame(Connection.CHANNEL, delivery_tag, BASIC_ACK)
