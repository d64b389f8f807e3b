"""The workload's fast clients: the same publishers and consumers as
L{spark_jobs.clients}, logging the same events, but on the pipelining
raw-socket client of the benchmarks (L{benchmarks.amqp_client}) instead of
pika, so that they cost a fraction of what the broker does and the run
measures the broker. Each is one OS process with one connection; it
reconnects to the broker's next incarnation after a crash, one session later.

A publisher writes each batch of publishes the gate and its window allow in
one write and logs them; confirms come back as multiple acks. A consumer
hands the acks decided during one socket read to the broker as one multiple
ack at the end of that read; a nack or reject first sends the acks decided
before it, so the broker sees the decisions in order.
"""

import hashlib
import pathlib
import time
import traceback

from pamqp import commands

from benchmarks.amqp_client import BrokerGone, Connection, Loop
from benchmarks.amqp_codec import (
    BASIC_NACK,
    BASIC_REJECT,
    BenchmarkError,
    PublishFramer,
    encode_properties,
    message_properties,
    settle_frame,
)
from spark_jobs import events
from spark_jobs.clients import (
    CLAIM_BATCH,
    GATE_POLL,
    PUBLISH_WINDOW,
    RECONNECT_BACKOFF,
    RECONNECT_DEADLINE,
    STOP_POLL,
    ClientFailed,
    returns_before,
)
from spark_jobs.control import ACKED, BROKER_NACKED, CONFIRMED, CPU_MS, DELIVERED, NACKED, PUBLISHED, REJECTED, \
    SESSIONS, EventLog
from spark_jobs.plan import build_topology, publisher_message_count, publisher_messages, settle_decision
from spark_jobs.settings import WorkloadSettings

PRODUCT = "brokerd validation workload"
PERSISTENT = 2


def run_publisher(config, control, number):
    """Process entry point of fast publisher C{number}."""
    _run_client(FastPublisher(config, control, number), control)


def run_consumer(config, control, number):
    """Process entry point of fast consumer C{number}."""
    _run_client(FastConsumer(config, control, number), control)


def _run_client(client, control):
    try:
        client.run()
    except BaseException as failure:
        control.report_failure(client.name, "".join(traceback.format_exception(failure)).rstrip())
        raise


class FastClient:
    """
    The connection life of one fast client: connect to the broker's current
    incarnation, work until the connection ends, and connect again (one
    session more) until the work is done. Counts its own CPU time from the
    moment it is ready to its end (L{CPU_MS}), so the run can tell whether
    the broker or its clients were the limit.

    @ivar session: the current connection's number, from 0; -1 before the first.
    @ivar epoch: the broker incarnation the current connection talks to.
    """

    role = None

    def __init__(self, config, control, number):
        self.config = config
        self.control = control
        self.number = number
        self.name = f"{self.role}-{number}"
        self.settings = WorkloadSettings.from_json(config.settings)
        self.row = self.counter_row()
        self.topology = build_topology(self.settings)
        self.log = EventLog(pathlib.Path(config.events_dir) / f"{self.name}.jsonl", config.backend, self.name)
        self.session = -1
        self.epoch = -1
        self.finished = False
        self.connection = None
        self.cpu_from = None

    def run(self):
        """Run sessions until the work is done; L{ClientFailed} if the broker stays away too long."""
        gone_since = time.monotonic()
        try:
            while not self.finished:
                epoch, port = self.control.broker()
                if port:  # 0 while the broker is being restarted
                    opened_before = self.session
                    try:
                        self._session(epoch, port)
                    except BrokerGone:
                        self.lost()
                    except BenchmarkError as problem:
                        raise ClientFailed(f"{self.name}: {problem}") from None
                    if self.session != opened_before:
                        gone_since = time.monotonic()
                if self.finished:
                    break
                if time.monotonic() - gone_since > RECONNECT_DEADLINE:
                    raise ClientFailed(f"{self.name}: no broker to connect to for {RECONNECT_DEADLINE:.0f} s"
                                       f" (last tried epoch {epoch}, port {port})")
                time.sleep(RECONNECT_BACKOFF)
        finally:
            self.log.close()
            if self.cpu_from is not None:
                self.control.count(self.row, CPU_MS, round((time.process_time() - self.cpu_from) * 1000))

    def _session(self, epoch, port):
        loop = Loop()
        config = self.config
        connection = Connection(loop, config.host, port, self.name, username=config.username,
                                password=config.password,
                                virtual_host=config.virtual_host, product=PRODUCT)
        try:
            connection.open()
            self.session += 1
            self.epoch = epoch
            self.connection = connection
            self.control.count(self.row, SESSIONS)
            self.start()
            while not self.finished:
                loop.turn(self.poll_seconds())
                self.tick()
            connection.close()
        finally:
            connection.shut()

    def ready(self):
        """The first session is set up: count CPU from here, and tell the runner."""
        if self.session == 0:
            self.cpu_from = time.process_time()
            self.control.client_ready()

    def record(self, kind, fields):
        self.log.write(kind, self.session, self.epoch, fields)

    def counter_row(self):
        raise NotImplementedError

    def start(self):
        """The session's channel is open: set up the client's work on it."""
        raise NotImplementedError

    def tick(self):
        """After each turn of the loop: go on with the work."""

    def poll_seconds(self):
        return STOP_POLL

    def lost(self):
        """The connection ended because the broker went away."""


class FastPublisher(FastClient):
    """
    Publishes its planned messages in order, taking permission from the run's
    gate, with at most L{PUBLISH_WINDOW} unconfirmed (or, without confirm mode,
    between two round-trip barriers).
    """

    role = "publisher"

    def __init__(self, config, control, number):
        super().__init__(config, control, number)
        self.messages = publisher_messages(self.settings, self.topology, number)
        self.total = publisher_message_count(self.settings, number)
        self.sent = 0
        self.unconfirmed = {}  # delivery tag -> (seq, message id), in tag order
        self.oldest_tag = 1
        self.next_tag = 1
        self.at_gate = False
        self.confirm = self.settings.confirm
        self.priorities = self.settings.max_priority > 0

    def counter_row(self):
        return self.number

    def start(self):
        self.unconfirmed.clear()
        self.oldest_tag = self.next_tag = 1
        self.framer = PublishFramer(Connection.CHANNEL, self.connection.frame_max)
        if self.confirm:
            self.connection.on_confirm = self._confirmed
            self.connection.rpc(commands.Confirm.Select(), commands.Confirm.SelectOk)
        self.ready()
        self.fill()

    def lost(self):
        # What was unconfirmed stays unconfirmed: it may or may not have been stored.
        self.unconfirmed.clear()
        if self.sent == self.total:
            self.finished = True

    def poll_seconds(self):
        if self.at_gate:
            return GATE_POLL
        return 0 if self._more_without_confirms() else STOP_POLL

    def _more_without_confirms(self):
        return not self.confirm and self.sent < self.total

    def tick(self):
        if self.at_gate or self._more_without_confirms():
            self.fill()

    def fill(self):
        """Publish while the window has room and the gate allows; close once everything is answered."""
        self.at_gate = False
        room = min(PUBLISH_WINDOW - len(self.unconfirmed), self.total - self.sent)
        frames = []
        while room > 0:
            granted = self.control.claim(min(room, CLAIM_BATCH))
            if not granted:
                self.at_gate = True
                break
            for _ in range(granted):
                frames.append(self._publish(next(self.messages)))
            room -= granted
            self.control.count(self.row, PUBLISHED, granted)
            self.control.published(granted)
        if frames:
            self.connection.write(b"".join(frames))
        if not self.confirm and self.unconfirmed:
            # A round trip on the channel: once it is answered, the broker has read every publish before it.
            self.connection.rpc(commands.Basic.Qos(prefetch_count=0), commands.Basic.QosOk)
            self.unconfirmed.clear()
        if self.sent == self.total and not self.unconfirmed:
            self.finished = True

    def _publish(self, message):
        """The frames of one planned message, logged as published."""
        body = message.body
        properties = encode_properties(delivery_mode=PERSISTENT, message_id=message.message_id,
                                       priority=message.priority if self.priorities else None,
                                       headers=message.headers)
        self.record(events.PUBLISH, {
            "message_id": message.message_id,
            "publisher": self.number,
            "seq": message.seq,
            "exchange": message.exchange,
            "routing_key": message.routing_key,
            "queues": message.queues,
            "size": len(body),
            "body_sha256": hashlib.sha256(body).hexdigest(),
            "priority": message.priority,
            "confirm": self.confirm,
        })
        self.unconfirmed[self.next_tag] = (message.seq, message.message_id)
        self.next_tag += 1
        self.sent += 1
        return self.framer.frames(message.exchange, message.routing_key, body, properties)

    def _confirmed(self, channel, last, multiple, ok):
        first = self.oldest_tag if multiple else last
        if not self.oldest_tag <= first <= last < self.next_tag:
            raise BenchmarkError(f"confirm of tag {last} (multiple={multiple}) while tags {self.oldest_tag}.."
                                 f"{self.next_tag - 1} are unconfirmed")
        answered = 0
        for tag in range(first, last + 1):
            entry = self.unconfirmed.pop(tag, None)
            if entry is not None:
                seq, identifier = entry
                self.record(events.CONFIRM, {"message_id": identifier, "publisher": self.number, "seq": seq,
                                             "ok": ok})
                answered += 1
        while self.oldest_tag < self.next_tag and self.oldest_tag not in self.unconfirmed:
            self.oldest_tag += 1
        self.control.count(self.row, CONFIRMED if ok else BROKER_NACKED, answered)
        if not self.at_gate:
            self.fill()


class FastConsumer(FastClient):
    """
    Consumes every consumed queue of the workload on one channel (prefetch per
    consumer from the settings) and settles each delivery as
    L{settle_decision} says, until the runner says stop.

    A broker that does not count returns in an C{x-delivery-count} header
    (RabbitMQ's classic queues) gets the count of nacks this consumer sent for
    that message and queue instead, so nacking still stops after a few rounds.
    """

    role = "consumer"

    def __init__(self, config, control, number):
        super().__init__(config, control, number)
        self.queue_of_tag = {}
        self.ack_upto = 0  # the last delivery tag decided "ack" whose ack is not sent yet; 0 when none
        self.nacks_sent = {}  # (message id, queue) -> nacks this consumer sent, for brokers without x-delivery-count

    def counter_row(self):
        return self.settings.publishers + self.number

    def start(self):
        self.ack_upto = 0
        connection = self.connection
        connection.on_delivery = self._delivered
        connection.after_read = self._send_acks
        connection.rpc(commands.Basic.Qos(prefetch_count=self.settings.prefetch), commands.Basic.QosOk)
        self.queue_of_tag = {}
        for queue in self.topology.queues:
            tag = f"{self.name}/{queue}"
            self.queue_of_tag[tag] = queue
            connection.rpc(commands.Basic.Consume(queue=queue, consumer_tag=tag), commands.Basic.ConsumeOk)
        self.ready()

    def lost(self):
        self.ack_upto = 0  # acks not sent are lost with the connection; those messages come back

    def tick(self):
        if self.control.stop.is_set():
            self._send_acks()
            self.finished = True

    def _send_acks(self):
        if self.ack_upto:
            self.connection.ack(self.ack_upto, multiple=True)
            self.ack_upto = 0

    def _delivered(self, delivery):
        queue = self.queue_of_tag.get(delivery.consumer_tag)
        if queue is None:
            raise BenchmarkError(f"delivery {delivery.delivery_tag} for consumer tag {delivery.consumer_tag!r},"
                                 f" which this consumer never used")
        identifier, headers = message_properties(delivery.properties)
        if identifier is None:
            raise BenchmarkError(f"delivery {delivery.delivery_tag} from {queue} has no message-id: the broker"
                                 f" lost it")
        delivery_count = returns_before(headers, self.nacks_sent.get((identifier, queue), 0))
        tag, body = delivery.delivery_tag, delivery.body
        self.record(events.DELIVER, {
            "message_id": identifier,
            "queue": queue,
            "consumer": self.number,
            "delivery_tag": tag,
            "redelivered": delivery.redelivered,
            "delivery_count": delivery_count,
            "size": len(body),
            "body_sha256": hashlib.sha256(body).hexdigest(),
        })
        self.control.count(self.row, DELIVERED)
        decision = settle_decision(self.settings, identifier, queue, delivery_count)
        if decision == events.ACK:
            self.ack_upto = tag
            counter, requeue = ACKED, False
        else:
            self._send_acks()
            if decision == events.NACK:
                self.connection.write(settle_frame(delivery.channel, tag, BASIC_NACK, requeue=True))
                key = (identifier, queue)
                self.nacks_sent[key] = self.nacks_sent.get(key, 0) + 1
                counter, requeue = NACKED, True
            else:
                self.connection.write(settle_frame(delivery.channel, tag, BASIC_REJECT, requeue=False))
                counter, requeue = REJECTED, False
        self.record(decision, {"message_id": identifier, "queue": queue, "consumer": self.number,
                               "requeue": requeue})
        self.control.count(self.row, counter)
