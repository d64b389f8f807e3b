"""The workload's clients on pika: each publisher and each consumer is one OS
process driving the broker through one asynchronous pika connection
(SelectConnection), so that a real client library's behaviour is covered
(L{spark_jobs.clients} says what every client does).

A client is its work on one channel, a L{Publisher} or a L{Consumer}, run by
L{PikaSessions}, which connects to the broker's current incarnation and
connects again after a crash; the work logs what it did and saw through its
L{spark_jobs.client_logs} objects.
"""

import time

import pika
from pika import spec

from spark_jobs import events
from spark_jobs.client_logs import ClientLog, ConfirmOutOfOrder, ConsumerLog, PublisherLog
from spark_jobs.clients import (
    CLAIM_BATCH,
    GATE_POLL,
    PUBLISH_WINDOW,
    RECONNECT_BACKOFF,
    RECONNECT_DEADLINE,
    STOP_POLL,
    ClientFailed,
    consumer_tags,
    run_client,
)
from spark_jobs.control import PUBLISHED
from spark_jobs.plan import build_topology
from spark_jobs.settings import WorkloadSettings


def run_publisher(config, control, number):
    """Process entry point of publisher C{number}."""
    settings = WorkloadSettings.from_json(config.settings)
    log = ClientLog.of_publisher(config, control, number)
    book = PublisherLog(log, settings, build_topology(settings), number)
    publisher = Publisher(book, log, control, settings)
    run_client(PikaSessions(config, control, log, publisher), log, control)


def run_consumer(config, control, number):
    """Process entry point of consumer C{number}."""
    settings = WorkloadSettings.from_json(config.settings)
    log = ClientLog.of_consumer(config, control, settings, number)
    tags = consumer_tags(log.name, build_topology(settings))
    consumer = Consumer(ConsumerLog(log, settings, number), log, control, settings, tags)
    run_client(PikaSessions(config, control, log, consumer), log, control)


class PikaSessions:
    """
    The connection life of one pika client: connect to the broker's current
    incarnation, run until the connection ends, and connect again (one
    session more) until the client's work is finished.

    The work (a L{Publisher} or a L{Consumer}) is told when a session's
    channel is open (C{start(sessions, channel)}) and when the connection
    ended, on purpose or because the broker went away (C{lost()}); it says
    it is done by setting its C{finished}.

    @ivar channel: the current session's channel; C{None} before it opens and once the
        connection ended.
    """

    def __init__(self, config, control, log, work):
        """
        @param config: the run's L{spark_jobs.clients.ClientConfig}.
        @param control: the run's L{spark_jobs.control.RunControl}.
        @param log: the client's L{ClientLog}, told of each new session.
        """
        self._config = config
        self._control = control
        self._log = log
        self._work = work
        self._failure = None
        self._connection = None
        self._closing = False
        self.channel = None

    def run(self):
        """Run sessions until the work is done; L{ClientFailed} if the broker stays away too
        long."""
        gone_since = None
        log, work = self._log, self._work
        while not work.finished:
            epoch, port = self._control.broker()
            opened_before = log.session
            if port:  # 0 while the broker is being restarted
                self._connect(epoch, port)
            if self._failure is not None:
                raise ClientFailed(f"{log.name}: {self._failure}")
            if work.finished:
                break
            now = time.monotonic()
            if log.session != opened_before or gone_since is None:
                gone_since = now
            elif now - gone_since > RECONNECT_DEADLINE:
                raise ClientFailed(f"{log.name}: no broker to connect to for"
                                   f" {RECONNECT_DEADLINE:.0f} s"
                                   f" (last tried epoch {epoch}, port {port})")
            time.sleep(RECONNECT_BACKOFF)

    def _connect(self, epoch, port):
        config = self._config
        parameters = pika.ConnectionParameters(
            host=config.host,
            port=port,
            connection_attempts=1,
            virtual_host=config.virtual_host,
            credentials=pika.PlainCredentials(config.username, config.password),
            socket_timeout=10,
            client_properties={"connection_name": self._log.name},
        )
        self._closing = False
        self._connection = pika.SelectConnection(
            parameters,
            on_open_callback=lambda connection: self._opened(connection, epoch),
            on_open_error_callback=self._open_failed,
            on_close_callback=self._closed,
        )
        ioloop = self._connection.ioloop
        try:
            ioloop.start()
        finally:
            self.channel = None
            ioloop.close()

    def _open_failed(self, connection, error):
        # No broker listening (it is being restarted) is worth another try; a refusal is not.
        refusals = (pika.exceptions.ConnectionClosedByBroker,
                    pika.exceptions.ProbableAccessDeniedError,
                    pika.exceptions.ProbableAuthenticationError)
        if isinstance(error, refusals):
            self._failure = f"the broker refused the connection: {error!r}"
        connection.ioloop.stop()

    def _opened(self, connection, epoch):
        self._log.new_session(epoch)
        connection.channel(on_open_callback=self._channel_opened)

    def _channel_opened(self, channel):
        self.channel = channel
        channel.add_on_close_callback(self._channel_closed)
        self._work.start(self, channel)

    def _channel_closed(self, channel, reason):
        if isinstance(reason, pika.exceptions.ChannelClosedByBroker):
            self.fail(f"the broker closed the channel: {reason}")
        elif not self._closing and self._connection.is_open:
            self.fail(f"the channel closed: {reason}")

    def _closed(self, connection, reason):
        self.channel = None
        if isinstance(reason, pika.exceptions.ConnectionClosedByBroker) and not self._closing:
            # A crash cuts the connection; a broker that closes it on purpose says something is
            # wrong.
            self._failure = self._failure or f"the broker closed the connection: {reason}"
        self._work.lost()
        connection.ioloop.stop()

    def call_later(self, delay, callback):
        """Calls C{callback} after C{delay} seconds on the current connection's loop."""
        self._connection.ioloop.call_later(delay, callback)

    def fail(self, text):
        """Stop the client with C{text} as the reason."""
        if self._failure is None:
            self._failure = text
        self.close()

    def close(self):
        """Close the connection on purpose (the client is done or failed)."""
        self._closing = True
        if self._connection.is_open:
            self._connection.close()
        elif not self._connection.is_closing:
            self._connection.ioloop.stop()


class Publisher:
    """
    Publishes its planned messages in order, taking permission from the
    run's gate, with at most L{PUBLISH_WINDOW} unconfirmed (or, without
    confirm mode, between two round-trip barriers).

    @ivar finished: every planned message was published and answered, or lost with a connection.
    """

    def __init__(self, book, log, control, settings):
        """
        @param book: the publisher's L{PublisherLog}: its planned messages, and the publishes
            waiting for an answer.
        @param log: the publisher's L{ClientLog}.
        @param control: the run's L{spark_jobs.control.RunControl}, whose gate it takes
            permission from.
        @param settings: the run's L{spark_jobs.settings.WorkloadSettings}.
        """
        self.finished = False
        self._book = book
        self._log = log
        self._control = control
        self._confirm = settings.confirm
        self._priorities = settings.max_priority > 0
        self._sessions = None
        self._publishing = False
        self._waiting_at_gate = False

    def start(self, sessions, channel):
        """A session's C{channel} is open: publish on it once confirm mode is on."""
        self._sessions = sessions
        self._book.new_channel()
        if self._confirm:
            channel.confirm_delivery(self._confirmed, callback=lambda _: self._start_publishing())
        else:
            self._start_publishing()

    def _start_publishing(self):
        self._publishing = True
        self._log.ready()
        self.fill()

    def lost(self):
        """The connection ended: what it left unconfirmed stays so."""
        self._publishing = False
        self._book.channel_lost()
        if self._book.all_sent:
            self.finished = True

    def fill(self):
        """Publish while the window has room and the gate allows; close once everything is
        answered."""
        self._waiting_at_gate = False
        channel = self._sessions.channel
        if not self._publishing or channel is None:
            return
        book = self._book
        room = book.room(PUBLISH_WINDOW)
        while room > 0:
            granted = self._control.claim(min(room, CLAIM_BATCH))
            if not granted:
                self._waiting_at_gate = True
                self._sessions.call_later(GATE_POLL, self.fill)
                return
            for message in book.next_messages(granted):
                self._publish(channel, message)
            self._log.count(PUBLISHED, granted)
            self._control.published(granted)
            room -= granted
        if not self._confirm and book.unanswered:
            # A round trip on the channel: once it is answered, the broker has read every
            # publish before it.
            self._publishing = False
            channel.basic_qos(prefetch_count=0, callback=self._barrier_passed)
        elif book.all_answered:
            self.finished = True
            self._sessions.close()

    def _publish(self, channel, message):
        properties = pika.BasicProperties(
            message_id=message.message_id,
            delivery_mode=2,
            headers=message.headers,
            priority=message.priority if self._priorities else None,
        )
        channel.basic_publish(message.exchange, message.routing_key, message.body, properties)
        self._book.published(message)

    def _barrier_passed(self, _frame):
        self._book.barrier_passed()
        self._publishing = True
        self.fill()

    def _confirmed(self, frame):
        method = frame.method
        try:
            self._book.confirmed(method.delivery_tag, method.multiple,
                                 isinstance(method, spec.Basic.Ack))
        except ConfirmOutOfOrder as problem:
            self._sessions.fail(str(problem))
            return
        if not self._waiting_at_gate:
            self.fill()


class Consumer:
    """
    Consumes every consumed queue of the workload on one channel (prefetch
    per consumer from the settings) and settles each delivery as its
    L{ConsumerLog} decides, until the runner says stop. Acks wait for the
    end of the current read and go out as one multiple ack; a nack or reject
    first sends the acks decided before it, so the broker sees the decisions
    in order.

    @ivar finished: the runner said stop, and the acks decided were sent.
    """

    def __init__(self, book, log, control, settings, tags):
        """
        @param book: the consumer's L{ConsumerLog}, which logs each delivery and decides its settle.
        @param log: the consumer's L{ClientLog}.
        @param control: the run's L{spark_jobs.control.RunControl}, whose stop signal it watches.
        @param settings: the run's L{spark_jobs.settings.WorkloadSettings}.
        @param tags: C{(consumer tag, queue)} of each queue to consume
            (L{spark_jobs.clients.consumer_tags}).
        """
        self.finished = False
        self._book = book
        self._log = log
        self._control = control
        self._prefetch = settings.prefetch
        self._tags = tags
        self._queue_of_tag = dict(tags)
        self._sessions = None
        # The last delivery tag decided "ack" whose ack is not sent yet; 0 when none.
        self._ack_upto = 0

    def start(self, sessions, channel):
        """A session's C{channel} is open: consume every queue on it."""
        self._sessions = sessions
        self._ack_upto = 0
        channel.basic_qos(prefetch_count=self._prefetch, callback=lambda _: self._consume(channel))
        sessions.call_later(STOP_POLL, self._check_stop)

    def lost(self):
        """The connection ended: acks not sent are lost with it, and those messages come back."""
        self._ack_upto = 0

    def _consume(self, channel):
        tags = self._tags
        for tag, queue in tags:
            last = tag == tags[-1][0]
            channel.basic_consume(queue, self._delivered, consumer_tag=tag,
                                  callback=self._consuming if last else None)

    def _consuming(self, _frame):
        self._log.ready()

    def _check_stop(self):
        if self._control.stop.is_set():
            self._send_acks()
            self.finished = True
            self._sessions.close()
        elif self._sessions.channel is not None:
            self._sessions.call_later(STOP_POLL, self._check_stop)

    def _send_acks(self):
        channel = self._sessions.channel
        if self._ack_upto and channel is not None and channel.is_open:
            channel.basic_ack(self._ack_upto, multiple=True)
        self._ack_upto = 0

    def _delivered(self, channel, method, properties, body):
        queue = self._queue_of_tag[method.consumer_tag]
        identifier = properties.message_id
        if not isinstance(identifier, str):
            self._sessions.fail(f"delivery {method.delivery_tag} from {queue} has no message-id:"
                                f" the broker lost it")
            return
        tag = method.delivery_tag
        decision = self._book.delivered(queue, identifier, tag, method.redelivered,
                                        properties.headers, body)
        if decision == events.ACK:
            if not self._ack_upto:
                self._sessions.call_later(0, self._send_acks)
            self._ack_upto = tag
        else:
            self._send_acks()
            if decision == events.NACK:
                channel.basic_nack(tag, requeue=True)
            else:
                channel.basic_reject(tag, requeue=False)
