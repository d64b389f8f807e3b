"""The workload's fast clients: the same publishers and consumers as
L{spark_jobs.pika_clients}, logging the same events (L{spark_jobs.clients}
says what every client does), but on the pipelining raw-socket client
(L{brokerd.loadgen.amqp_client}) instead of pika, so that they cost a
fraction of what the broker does and the run measures the broker. Each is one
OS process with one connection: its work, a L{FastPublisher} or a
L{FastConsumer}, run by L{FastSessions}, which reconnects to the broker's
next incarnation after a crash, one session later.

A publisher writes each batch of publishes the gate and its window allow in
one write and logs them; confirms come back as multiple acks. A consumer
hands the acks decided during one socket read to the broker as one multiple
ack at the end of that read; a nack or reject first sends the acks decided
before it, so the broker sees the decisions in order.
"""

import time

from pamqp import commands

from brokerd.loadgen.amqp_client import BrokerGone, Connection, Loop
from brokerd.loadgen.amqp_codec import (
    BASIC_NACK,
    BASIC_REJECT,
    BenchmarkError,
    PublishFramer,
    encode_properties,
    message_properties,
    settle_frame,
)
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

PRODUCT = "brokerd validation workload"
PERSISTENT = 2


def run_publisher(config, control, number):
    """Process entry point of fast publisher C{number}."""
    settings = WorkloadSettings.from_json(config.settings)
    log = ClientLog.of_publisher(config, control, number)
    book = PublisherLog(log, settings, build_topology(settings), number)
    publisher = FastPublisher(book, log, control, settings)
    run_client(FastSessions(config, control, log, publisher), log, control)


def run_consumer(config, control, number):
    """Process entry point of fast consumer C{number}."""
    settings = WorkloadSettings.from_json(config.settings)
    log = ClientLog.of_consumer(config, control, settings, number)
    tags = consumer_tags(log.name, build_topology(settings))
    consumer = FastConsumer(ConsumerLog(log, settings, number), log, control, settings, tags)
    run_client(FastSessions(config, control, log, consumer), log, control)


class FastSessions:
    """
    The connection life of one fast client: connect to the broker's current
    incarnation, work until the connection ends, and connect again (one
    session more) until the work is finished.

    The work (a L{FastPublisher} or a L{FastConsumer}) is handed each
    session's open connection (C{start(connection)}), asked how long the
    loop may wait for the socket (C{poll_seconds()}) and told after each
    turn of the loop (C{tick()}) and when the broker went away (C{lost()});
    it says it is done by setting its C{finished}.
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

    def run(self):
        """Run sessions until the work is done; L{ClientFailed} if the broker stays away too
        long."""
        gone_since = time.monotonic()
        log, work = self._log, self._work
        while not work.finished:
            epoch, port = self._control.broker()
            if port:  # 0 while the broker is being restarted
                opened_before = log.session
                try:
                    self._session(epoch, port)
                except BrokerGone:
                    work.lost()
                except (BenchmarkError, ConfirmOutOfOrder) as problem:
                    raise ClientFailed(f"{log.name}: {problem}") from None
                if log.session != opened_before:
                    gone_since = time.monotonic()
            if work.finished:
                break
            if time.monotonic() - gone_since > RECONNECT_DEADLINE:
                raise ClientFailed(f"{log.name}: no broker to connect to for"
                                   f" {RECONNECT_DEADLINE:.0f} s"
                                   f" (last tried epoch {epoch}, port {port})")
            time.sleep(RECONNECT_BACKOFF)

    def _session(self, epoch, port):
        loop = Loop()
        config = self._config
        connection = Connection(loop, config.host, port, self._log.name,
                                username=config.username, password=config.password,
                                virtual_host=config.virtual_host, product=PRODUCT)
        try:
            connection.open()
            self._log.new_session(epoch)
            work = self._work
            work.start(connection)
            while not work.finished:
                loop.turn(work.poll_seconds())
                work.tick()
            connection.close()
        finally:
            connection.shut()


class FastPublisher:
    """
    Publishes its planned messages in order, taking permission from the run's
    gate, with at most L{PUBLISH_WINDOW} unconfirmed (or, without confirm mode,
    between two round-trip barriers); each batch the gate and the window allow
    goes out in one write.

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
        self._connection = None
        self._framer = None
        self._at_gate = False

    def start(self, connection):
        """A session's C{connection} is open: turn confirm mode on and publish."""
        self._connection = connection
        self._book.new_channel()
        self._framer = PublishFramer(Connection.CHANNEL, connection.frame_max)
        if self._confirm:
            connection.on_confirm = self._confirmed
            connection.rpc(commands.Confirm.Select(), commands.Confirm.SelectOk)
        self._log.ready()
        self.fill()

    def lost(self):
        """The broker went away: what it left unconfirmed stays so."""
        self._book.channel_lost()
        if self._book.all_sent:
            self.finished = True

    def poll_seconds(self):
        """How long the loop may wait for the socket: not at all while publishes without confirms
        are left."""
        if self._at_gate:
            return GATE_POLL
        return 0 if self._more_without_confirms() else STOP_POLL

    def _more_without_confirms(self):
        return not self._confirm and not self._book.all_sent

    def tick(self):
        """After a turn of the loop: publish more if the gate was shut or nothing waits for
        confirms."""
        if self._at_gate or self._more_without_confirms():
            self.fill()

    def fill(self):
        """Publish while the window has room and the gate allows; finish once everything is
        answered."""
        self._at_gate = False
        book = self._book
        room = book.room(PUBLISH_WINDOW)
        frames = []
        while room > 0:
            granted = self._control.claim(min(room, CLAIM_BATCH))
            if not granted:
                self._at_gate = True
                break
            for message in book.next_messages(granted):
                frames.append(self._publish(message))
            room -= granted
            self._log.count(PUBLISHED, granted)
            self._control.published(granted)
        if frames:
            self._connection.write(b"".join(frames))
        if not self._confirm and book.unanswered:
            # A round trip on the channel: once it is answered, the broker has read every
            # publish before it.
            self._connection.rpc(commands.Basic.Qos(prefetch_count=0), commands.Basic.QosOk)
            book.barrier_passed()
        if book.all_answered:
            self.finished = True

    def _publish(self, message):
        """The frames of one planned message, logged as published."""
        properties = encode_properties(delivery_mode=PERSISTENT, message_id=message.message_id,
                                       priority=message.priority if self._priorities else None,
                                       headers=message.headers)
        self._book.published(message)
        return self._framer.frames(message.exchange, message.routing_key, message.body, properties)

    def _confirmed(self, channel, last, multiple, ok):
        self._book.confirmed(last, multiple, ok)
        if not self._at_gate:
            self.fill()


class FastConsumer:
    """
    Consumes every consumed queue of the workload on one channel (prefetch per
    consumer from the settings) and settles each delivery as its
    L{ConsumerLog} decides, until the runner says stop. The acks decided
    during one socket read go to the broker as one multiple ack at the end of
    that read; a nack or reject first sends the acks decided before it, so the
    broker sees the decisions in order.

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
        self._connection = None
        # The last delivery tag decided "ack" whose ack is not sent yet; 0 when none.
        self._ack_upto = 0

    def start(self, connection):
        """A session's C{connection} is open: consume every queue on it."""
        self._connection = connection
        self._ack_upto = 0
        connection.on_delivery = self._delivered
        connection.after_read = self._send_acks
        connection.rpc(commands.Basic.Qos(prefetch_count=self._prefetch), commands.Basic.QosOk)
        for tag, queue in self._tags:
            connection.rpc(commands.Basic.Consume(queue=queue, consumer_tag=tag),
                           commands.Basic.ConsumeOk)
        self._log.ready()

    def lost(self):
        """The broker went away: acks not sent are lost with the connection, and those messages
        come back."""
        self._ack_upto = 0

    def poll_seconds(self):
        """How long the loop may wait for the socket before the next look at the stop signal."""
        return STOP_POLL

    def tick(self):
        """After a turn of the loop: once the runner says stop, send the acks decided and finish."""
        if self._control.stop.is_set():
            self._send_acks()
            self.finished = True

    def _send_acks(self):
        if self._ack_upto:
            self._connection.ack(self._ack_upto, multiple=True)
            self._ack_upto = 0

    def _delivered(self, delivery):
        queue = self._queue_of_tag.get(delivery.consumer_tag)
        if queue is None:
            raise BenchmarkError(f"delivery {delivery.delivery_tag} for consumer tag"
                                 f" {delivery.consumer_tag!r}, which this consumer never used")
        identifier, headers = message_properties(delivery.properties)
        if identifier is None:
            raise BenchmarkError(f"delivery {delivery.delivery_tag} from {queue} has no"
                                 f" message-id: the broker lost it")
        tag = delivery.delivery_tag
        decision = self._book.delivered(queue, identifier, tag, delivery.redelivered, headers,
                                        delivery.body)
        if decision == events.ACK:
            self._ack_upto = tag
            return
        self._send_acks()
        kind, requeue = (BASIC_NACK, True) if decision == events.NACK else (BASIC_REJECT, False)
        self._connection.write(settle_frame(delivery.channel, tag, kind, requeue=requeue))
