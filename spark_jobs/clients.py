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

import time
from dataclasses import dataclass

import pika
from pika import spec

from spark_jobs import events
from spark_jobs.client_books import ClientBook, ConfirmOutOfOrder, ConsumerBook, PublisherBook, run_client
from spark_jobs.control import PUBLISHED, SESSIONS

PUBLISH_WINDOW = 1000  # most unconfirmed publishes per publisher (without confirms: publishes between barriers)
CLAIM_BATCH = 100  # publishes taken from the gate at once; small, so a crash lands close to its boundary
GATE_POLL = 0.005  # seconds between looks at a shut gate
STOP_POLL = 0.05  # seconds between a consumer's looks at the stop signal
RECONNECT_DEADLINE = 600.0  # seconds a client keeps trying to reach the broker (a big store recovers slowly)
RECONNECT_BACKOFF = 0.05  # seconds between attempts to connect


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
    run_client(Publisher(config, control, number))


def run_consumer(config, control, number):
    """Process entry point of consumer C{number}."""
    run_client(Consumer(config, control, number))


class Client(ClientBook):
    """
    The connection life of one pika client: connect to the broker's current
    incarnation, run until the connection ends, and connect again (one
    session more) until the client's work is done.
    """

    def __init__(self, config, control, number):
        super().__init__(config, control, number)
        self.failure = None
        self.connection = None
        self.channel = None
        self._closing = False

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
            self.close_book()

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

    def start(self, channel):
        """The session's channel is open: begin the client's work on it."""
        raise NotImplementedError

    def lost(self):
        """The connection ended, on purpose or because the broker went away."""


class Publisher(Client, PublisherBook):
    """
    Publishes its planned messages in order, taking permission from the
    run's gate, with at most L{PUBLISH_WINDOW} unconfirmed (or, without
    confirm mode, between two round-trip barriers).
    """

    def __init__(self, config, control, number):
        super().__init__(config, control, number)
        self.publishing = False
        self.waiting_at_gate = False

    def start(self, channel):
        self.new_channel()
        if self.confirm:
            channel.confirm_delivery(self._confirmed, callback=lambda _: self._start_publishing())
        else:
            self._start_publishing()

    def _start_publishing(self):
        self.publishing = True
        self.ready()
        self.fill()

    def lost(self):
        self.publishing = False
        self.channel_lost()

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
        self.channel.basic_publish(message.exchange, message.routing_key, message.body, properties)
        self.published(message)

    def _barrier_passed(self, _frame):
        self.unconfirmed.clear()
        self.publishing = True
        self.fill()

    def _confirmed(self, frame):
        method = frame.method
        try:
            self.confirmed(method.delivery_tag, method.multiple, isinstance(method, spec.Basic.Ack))
        except ConfirmOutOfOrder as problem:
            self.fail(str(problem))
            return
        if not self.waiting_at_gate:
            self.fill()


class Consumer(Client, ConsumerBook):
    """
    Consumes every consumed queue of the workload on one channel (prefetch
    per consumer from the settings) and settles each delivery as its book
    decides (L{ConsumerBook}), until the runner says stop. Acks wait for the
    end of the current read and go out as one multiple ack; a nack or reject
    first sends the acks decided before it, so the broker sees the decisions
    in order.
    """

    def __init__(self, config, control, number):
        super().__init__(config, control, number)
        self.queue_of_tag = dict(self.consumer_tags())
        self.ack_upto = 0  # the last delivery tag decided "ack" whose ack is not sent yet; 0 when none

    def start(self, channel):
        self.ack_upto = 0
        channel.basic_qos(prefetch_count=self.settings.prefetch, callback=lambda _: self._consume(channel))
        self.connection.ioloop.call_later(STOP_POLL, self._check_stop)

    def lost(self):
        self.ack_upto = 0  # acks not sent are lost with the connection; those messages come back

    def _consume(self, channel):
        tags = self.consumer_tags()
        for tag, queue in tags:
            last = tag == tags[-1][0]
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
        tag = method.delivery_tag
        decision = self.delivered(queue, identifier, tag, method.redelivered, properties.headers, body)
        if decision == events.ACK:
            if not self.ack_upto:
                self.connection.ioloop.call_later(0, self._send_acks)
            self.ack_upto = tag
        else:
            self._send_acks()
            if decision == events.NACK:
                channel.basic_nack(tag, requeue=True)
            else:
                channel.basic_reject(tag, requeue=False)
