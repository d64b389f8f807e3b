"""The workload's clients: each publisher and each consumer is one OS process
driving the broker through one asynchronous pika connection (SelectConnection),
so that clients and broker share the machine's cores and no client waits a
round trip per message.

A publisher sends its planned messages as persistent messages with their id as
the AMQP message-id, keeping up to L{PUBLISH_WINDOW} unconfirmed. A consumer
consumes every consumed queue with manual acks and settles each delivery as the
plan decides. Both log what they did and saw (L{spark_jobs.events}); when the
broker dies under them they reconnect to its next incarnation, one session
later. A publisher does not send again what was unconfirmed at the crash: those
messages may be lost, and the run's checks only expect confirmed ones to stay.
"""

import hashlib
import pathlib
import time
import traceback
from dataclasses import dataclass

import pika
from pika import spec

from spark_jobs import events
from spark_jobs.control import (
    ACKED,
    BROKER_NACKED,
    CONFIRMED,
    DELIVERED,
    NACKED,
    PUBLISHED,
    REJECTED,
    SESSIONS,
    CPU_MS,
    EventLog,
)
from spark_jobs.plan import build_topology, publisher_message_count, publisher_messages, settle_decision
from spark_jobs.settings import WorkloadSettings

PUBLISH_WINDOW = 1000  # most unconfirmed publishes per publisher (without confirms: publishes between barriers)
CLAIM_BATCH = 100  # publishes taken from the gate at once; small, so a crash lands close to its boundary
GATE_POLL = 0.005  # seconds between looks at a shut gate
STOP_POLL = 0.05  # seconds between a consumer's looks at the stop signal
RECONNECT_DEADLINE = 600.0  # seconds a client keeps trying to reach the broker (a big store recovers slowly)
RECONNECT_BACKOFF = 0.05  # seconds between attempts to connect


def returns_before(headers, own_returns):
    """
    How often a delivery came back to its queue before, for L{settle_decision}:
    the x-delivery-count header when the broker sent one, else C{own_returns},
    the returns the consumer itself caused (its nacks with requeue of that
    message from that queue). Without the header, a message returned by
    another consumer counts from 0 again here, so it may be nacked up to
    consumers x L{spark_jobs.plan.MAX_NACKS} times in all rather than
    C{MAX_NACKS}.
    """
    count = headers.get("x-delivery-count") if headers else None
    return own_returns if count is None else int(count)


class ClientFailed(RuntimeError):
    """A client could not go on: the broker stayed away, or closed a channel on it."""


@dataclass(frozen=True)
class ClientConfig:
    """What every client process of a run needs to know, small enough to hand to a new process: the run's
    label, settings and events directory, and where and as whom to log in (the port comes from the run's
    L{RunControl}, one per broker incarnation)."""

    backend: str
    settings: dict
    events_dir: str
    host: str = "127.0.0.1"
    username: str = "guest"
    password: str = "guest"
    virtual_host: str = "/"


def run_publisher(config, control, number):
    """Process entry point of publisher C{number}."""
    _run_client(Publisher(config, control, number), control)


def run_consumer(config, control, number):
    """Process entry point of consumer C{number}."""
    _run_client(Consumer(config, control, number), control)


def _run_client(client, control):
    try:
        client.run()
    except BaseException as failure:
        control.report_failure(client.name, "".join(traceback.format_exception(failure)).rstrip())
        raise


class Client:
    """
    The connection life of one client: connect to the broker's current
    incarnation, run until the connection ends, and connect again (one
    session more) until the client's work is done.

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
        self.failure = None
        self.connection = None
        self.channel = None
        self._closing = False
        self.cpu_from = None

    def run(self):
        """Run sessions until the work is done; L{ClientFailed} if the broker stays away too long."""
        gone_since = None
        try:
            while not self.finished:
                epoch, port = self.control.broker()
                opened_before = self.session
                if port:  # 0 while the broker is being restarted
                    self._connect(epoch, port)
                if self.failure is not None:
                    raise ClientFailed(f"{self.name}: {self.failure}")
                if self.finished:
                    break
                now = time.monotonic()
                if self.session != opened_before or gone_since is None:
                    gone_since = now
                elif now - gone_since > RECONNECT_DEADLINE:
                    raise ClientFailed(f"{self.name}: no broker to connect to for {RECONNECT_DEADLINE:.0f} s"
                                       f" (last tried epoch {epoch}, port {port})")
                time.sleep(RECONNECT_BACKOFF)
        finally:
            self.log.close()
            if self.cpu_from is not None:
                self.control.count(self.row, CPU_MS, round((time.process_time() - self.cpu_from) * 1000))

    def ready(self):
        """The first session is set up: count CPU from here, and tell the runner."""
        if self.session == 0:
            self.cpu_from = time.process_time()
            self.control.client_ready()

    def _connect(self, epoch, port):
        parameters = pika.ConnectionParameters(host=self.config.host, port=port, connection_attempts=1,
                                               virtual_host=self.config.virtual_host,
                                               credentials=pika.PlainCredentials(self.config.username,
                                                                                 self.config.password),
                                               socket_timeout=10, client_properties={"connection_name": self.name})
        self._closing = False
        self.connection = pika.SelectConnection(
            parameters,
            on_open_callback=lambda connection: self._opened(connection, epoch),
            on_open_error_callback=self._open_failed,
            on_close_callback=self._closed,
        )
        ioloop = self.connection.ioloop
        try:
            ioloop.start()
        finally:
            self.channel = None
            ioloop.close()

    def _open_failed(self, connection, error):
        # No broker listening (it is being restarted) is worth another try; a refusal is not.
        if isinstance(error, (pika.exceptions.ConnectionClosedByBroker, pika.exceptions.ProbableAccessDeniedError,
                              pika.exceptions.ProbableAuthenticationError)):
            self.failure = f"the broker refused the connection: {error!r}"
        connection.ioloop.stop()

    def _opened(self, connection, epoch):
        self.session += 1
        self.epoch = epoch
        self.control.count(self.row, SESSIONS)
        connection.channel(on_open_callback=self._channel_opened)

    def _channel_opened(self, channel):
        self.channel = channel
        channel.add_on_close_callback(self._channel_closed)
        self.start(channel)

    def _channel_closed(self, channel, reason):
        if isinstance(reason, pika.exceptions.ChannelClosedByBroker):
            self.fail(f"the broker closed the channel: {reason}")
        elif not self._closing and self.connection.is_open:
            self.fail(f"the channel closed: {reason}")

    def _closed(self, connection, reason):
        self.channel = None
        if isinstance(reason, pika.exceptions.ConnectionClosedByBroker) and not self._closing:
            # A crash cuts the connection; a broker that closes it on purpose says something is wrong.
            self.failure = self.failure or f"the broker closed the connection: {reason}"
        self.lost()
        connection.ioloop.stop()

    def fail(self, text):
        """Stop the client with C{text} as the reason."""
        if self.failure is None:
            self.failure = text
        self.close()

    def close(self):
        """Close the connection on purpose (the client is done or failed)."""
        self._closing = True
        if self.connection.is_open:
            self.connection.close()
        elif not self.connection.is_closing:
            self.connection.ioloop.stop()

    def counter_row(self):
        """This client's row of the run's counters."""
        raise NotImplementedError

    def start(self, channel):
        """The session's channel is open: begin the client's work on it."""
        raise NotImplementedError

    def lost(self):
        """The connection ended, on purpose or because the broker went away."""

    def record(self, kind, fields):
        self.log.write(kind, self.session, self.epoch, fields)


class Publisher(Client):
    """
    Publishes its planned messages in order, taking permission from the
    run's gate, with at most L{PUBLISH_WINDOW} unconfirmed (or, without
    confirm mode, between two round-trip barriers).
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
        self.publishing = False
        self.waiting_at_gate = False
        self.confirm = self.settings.confirm
        self.priorities = self.settings.max_priority > 0

    def counter_row(self):
        return self.number

    def start(self, channel):
        self.unconfirmed.clear()
        self.oldest_tag = self.next_tag = 1
        if self.confirm:
            channel.confirm_delivery(self._confirmed, callback=lambda _: self._start_publishing())
        else:
            self._start_publishing()

    def _start_publishing(self):
        self.publishing = True
        self.ready()
        self.fill()

    def lost(self):
        # What was unconfirmed stays unconfirmed: it may or may not have been stored.
        self.publishing = False
        self.unconfirmed.clear()
        if self.sent == self.total:
            self.finished = True

    def fill(self):
        """Publish while the window has room and the gate allows; close once everything is answered."""
        self.waiting_at_gate = False
        if not self.publishing or self.channel is None:
            return
        room = min(PUBLISH_WINDOW - len(self.unconfirmed), self.total - self.sent)
        while room > 0:
            granted = self.control.claim(min(room, CLAIM_BATCH))
            if not granted:
                self.waiting_at_gate = True
                self.connection.ioloop.call_later(GATE_POLL, self.fill)
                return
            for _ in range(granted):
                self._publish(next(self.messages))
            self.control.count(self.row, PUBLISHED, granted)
            self.control.published(granted)
            room -= granted
        if not self.confirm and self.unconfirmed:
            # A round trip on the channel: once it is answered, the broker has read every publish before it.
            self.publishing = False
            self.channel.basic_qos(prefetch_count=0, callback=self._barrier_passed)
        elif self.sent == self.total and not self.unconfirmed:
            self.finished = True
            self.close()

    def _publish(self, message):
        properties = pika.BasicProperties(
            message_id=message.message_id,
            delivery_mode=2,
            headers=message.headers,
            priority=message.priority if self.priorities else None,
        )
        body = message.body
        self.channel.basic_publish(message.exchange, message.routing_key, body, properties)
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

    def _barrier_passed(self, _frame):
        self.unconfirmed.clear()
        self.publishing = True
        self.fill()

    def _confirmed(self, frame):
        method = frame.method
        ok = isinstance(method, spec.Basic.Ack)
        last = method.delivery_tag
        first = self.oldest_tag if method.multiple else last
        if not self.oldest_tag <= first <= last < self.next_tag:
            self.fail(f"confirm of tag {last} (multiple={method.multiple}) while tags {self.oldest_tag}.."
                      f"{self.next_tag - 1} are unconfirmed")
            return
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
        if not self.waiting_at_gate:
            self.fill()


class Consumer(Client):
    """
    Consumes every consumed queue of the workload on one channel (prefetch
    per consumer from the settings) and settles each delivery as
    L{settle_decision} says, until the runner says stop. Acks wait for the end
    of the current read and go out as one multiple ack; a nack or reject first
    sends the acks decided before it, so the broker sees the decisions in order.

    How often a delivery came back before is the broker's x-delivery-count
    header when it sends one (brokerd does on every redelivery); a broker that
    does not (RabbitMQ's classic queues) gets the count of this consumer's own
    nacks of that message from that queue instead (L{returns_before}), so a
    message is nacked at most L{spark_jobs.plan.MAX_NACKS} times per consumer
    there.

    @ivar own_returns: C{(message id, queue)} -> how often this consumer nacked it with requeue.
    """

    role = "consumer"

    def __init__(self, config, control, number):
        super().__init__(config, control, number)
        self.queue_of_tag = {}
        self.ack_upto = 0  # the last delivery tag decided "ack" whose ack is not sent yet; 0 when none
        self.own_returns = {}

    def counter_row(self):
        return self.settings.publishers + self.number

    def start(self, channel):
        self.ack_upto = 0
        channel.basic_qos(prefetch_count=self.settings.prefetch, callback=lambda _: self._consume(channel))
        self.connection.ioloop.call_later(STOP_POLL, self._check_stop)

    def lost(self):
        self.ack_upto = 0  # acks not sent are lost with the connection; those messages come back

    def _consume(self, channel):
        self.queue_of_tag = {}
        for queue in self.topology.queues:
            tag = f"{self.name}/{queue}"
            self.queue_of_tag[tag] = queue
            last = queue == self.topology.queues[-1]
            channel.basic_consume(queue, self._delivered, consumer_tag=tag,
                                  callback=self._consuming if last else None)

    def _consuming(self, _frame):
        self.ready()

    def _check_stop(self):
        if self.control.stop.is_set():
            self._send_acks()
            self.finished = True
            self.close()
        elif self.channel is not None:
            self.connection.ioloop.call_later(STOP_POLL, self._check_stop)

    def _send_acks(self):
        if self.ack_upto and self.channel is not None and self.channel.is_open:
            self.channel.basic_ack(self.ack_upto, multiple=True)
        self.ack_upto = 0

    def _delivered(self, channel, method, properties, body):
        queue = self.queue_of_tag[method.consumer_tag]
        identifier = properties.message_id
        if not isinstance(identifier, str):
            self.fail(f"delivery {method.delivery_tag} from {queue} has no message-id: the broker lost it")
            return
        headers = properties.headers
        delivery_count = int(headers.get("x-delivery-count", 0)) if headers else 0
        tag = method.delivery_tag
        self.record(events.DELIVER, {
            "message_id": identifier,
            "queue": queue,
            "consumer": self.number,
            "delivery_tag": tag,
            "redelivered": bool(method.redelivered),
            "delivery_count": delivery_count,
            "size": len(body),
            "body_sha256": hashlib.sha256(body).hexdigest(),
        })
        self.control.count(self.row, DELIVERED)
        decision = settle_decision(self.settings, identifier, queue,
                                   returns_before(headers, self.own_returns.get((identifier, queue), 0)))
        if decision == events.ACK:
            if not self.ack_upto:
                self.connection.ioloop.call_later(0, self._send_acks)
            self.ack_upto = tag
            counter, requeue = ACKED, False
        else:
            self._send_acks()
            if decision == events.NACK:
                channel.basic_nack(tag, requeue=True)
                self.own_returns[identifier, queue] = self.own_returns.get((identifier, queue), 0) + 1
                counter, requeue = NACKED, True
            else:
                channel.basic_reject(tag, requeue=False)
                counter, requeue = REJECTED, False
        self.record(decision, {"message_id": identifier, "queue": queue, "consumer": self.number,
                               "requeue": requeue})
        self.control.count(self.row, counter)
