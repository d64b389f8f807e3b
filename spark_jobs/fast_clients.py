"""The workload's fast clients: the same publishers and consumers as
L{spark_jobs.clients}, logging the same events, but on the pipelining
raw-socket client of the benchmarks (L{brokerd.loadgen.amqp_client}) instead of
pika, so that they cost a fraction of what the broker does and the run
measures the broker. Each is one OS process with one connection; it
reconnects to the broker's next incarnation after a crash, one session later.

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
from spark_jobs.client_books import ClientBook, ConfirmOutOfOrder, ConsumerBook, PublisherBook, run_client
from spark_jobs.clients import (
    CLAIM_BATCH,
    GATE_POLL,
    PUBLISH_WINDOW,
    RECONNECT_BACKOFF,
    RECONNECT_DEADLINE,
    STOP_POLL,
    ClientFailed,
)
from spark_jobs.control import PUBLISHED, SESSIONS

PRODUCT = "brokerd validation workload"
PERSISTENT = 2


def run_publisher(config, control, number):
    """Process entry point of fast publisher C{number}."""
    run_client(FastPublisher(config, control, number))


def run_consumer(config, control, number):
    """Process entry point of fast consumer C{number}."""
    run_client(FastConsumer(config, control, number))


class FastClient(ClientBook):
    """
    The connection life of one fast client: connect to the broker's current
    incarnation, work until the connection ends, and connect again (one
    session more) until the work is done.
    """

    def __init__(self, config, control, number):
        super().__init__(config, control, number)
        self.connection = None

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
                    except (BenchmarkError, ConfirmOutOfOrder) as problem:
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
            self.close_book()

    def _session(self, epoch, port):
        loop = Loop()
        config = self.config
        connection = Connection(loop, config.host, port, self.name, username=config.username,
                                password=config.password, virtual_host=config.virtual_host, product=PRODUCT)
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

    def start(self):
        """The session's channel is open: set up the client's work on it."""
        raise NotImplementedError

    def tick(self):
        """After each turn of the loop: go on with the work."""

    def poll_seconds(self):
        return STOP_POLL

    def lost(self):
        """The connection ended because the broker went away."""


class FastPublisher(FastClient, PublisherBook):
    """
    Publishes its planned messages in order, taking permission from the run's
    gate, with at most L{PUBLISH_WINDOW} unconfirmed (or, without confirm mode,
    between two round-trip barriers); each batch the gate and the window allow
    goes out in one write.
    """

    def __init__(self, config, control, number):
        super().__init__(config, control, number)
        self.at_gate = False
        self.framer = None

    def start(self):
        self.new_channel()
        self.framer = PublishFramer(Connection.CHANNEL, self.connection.frame_max)
        if self.confirm:
            self.connection.on_confirm = self._confirmed
            self.connection.rpc(commands.Confirm.Select(), commands.Confirm.SelectOk)
        self.ready()
        self.fill()

    def lost(self):
        self.channel_lost()

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
        """Publish while the window has room and the gate allows; finish once everything is answered."""
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
        properties = encode_properties(delivery_mode=PERSISTENT, message_id=message.message_id,
                                       priority=message.priority if self.priorities else None,
                                       headers=message.headers)
        self.published(message)
        return self.framer.frames(message.exchange, message.routing_key, message.body, properties)

    def _confirmed(self, channel, last, multiple, ok):
        self.confirmed(last, multiple, ok)
        if not self.at_gate:
            self.fill()


class FastConsumer(FastClient, ConsumerBook):
    """
    Consumes every consumed queue of the workload on one channel (prefetch per
    consumer from the settings) and settles each delivery as its book decides,
    until the runner says stop. The acks decided during one socket read go to
    the broker as one multiple ack at the end of that read; a nack or reject
    first sends the acks decided before it, so the broker sees the decisions
    in order.
    """

    def __init__(self, config, control, number):
        super().__init__(config, control, number)
        self.queue_of_tag = dict(self.consumer_tags())
        self.ack_upto = 0  # the last delivery tag decided "ack" whose ack is not sent yet; 0 when none

    def start(self):
        self.ack_upto = 0
        connection = self.connection
        connection.on_delivery = self._delivered
        connection.after_read = self._send_acks
        connection.rpc(commands.Basic.Qos(prefetch_count=self.settings.prefetch), commands.Basic.QosOk)
        for tag, queue in self.consumer_tags():
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
        tag = delivery.delivery_tag
        decision = self.delivered(queue, identifier, tag, delivery.redelivered, headers, delivery.body)
        if decision == events.ACK:
            self.ack_upto = tag
            return
        self._send_acks()
        kind, requeue = (BASIC_NACK, True) if decision == events.NACK else (BASIC_REJECT, False)
        self.connection.write(settle_frame(delivery.channel, tag, kind, requeue=requeue))
