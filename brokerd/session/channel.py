"""Channel semantics, free of any wire protocol.

A L{Channel} is what one AMQP channel (or native-protocol channel) can do:
declare and delete topology, publish (optionally with publisher confirms),
consume with prefetch limits, get, and settle deliveries with ack, nack, reject
and recover. Protocol adapters translate frames into these calls and give the
channel an L{IChannelPeer} to push deliveries, returns and confirms through.
Errors are raised as L{brokerd.errors.BrokerError}s for the adapter to report.
It is made of parts that each own their state: its consumers
(L{brokerd.session.consumers.ChannelConsumers}, each a
L{brokerd.session.consumer.Consumer}), which its queues deliver to; its
L{brokerd.session.deliveries.Deliveries}, where they and basic.get take delivery
tags and leave what the client must settle, and which hold every consumer back
while the channel may not deliver; in confirm mode its
L{brokerd.session.confirms.PublisherConfirms}; in tx mode its
L{brokerd.session.transactions.Transaction}, which keeps publishes and
settlements for tx.commit.
Each channel counts the messages it publishes, delivers and has acked
(L{brokerd.session.counters}), one integer increment each, for its connection's totals,
and the unroutable publishes it drops or returns (counted on that path only).
Every operation is checked against the user's permissions (L{brokerd.access.permissions}).
"""

from twisted.logger import Logger

from brokerd.access.permissions import UNCHECKED
from brokerd.errors import NotFound, PreconditionFailed
from brokerd.model.message import Message
from brokerd.model.names import check_short_string
from brokerd.model.property_rules import check_arguments, check_properties
from brokerd.model.replyto import REPLY_PREFIX, REPLY_QUEUE
from brokerd.session.confirms import PublisherConfirms
from brokerd.session.consumer import delivered_message, trace_delivery
from brokerd.session.consumers import ChannelConsumers
from brokerd.session.deliveries import Deliveries
from brokerd.session.transactions import Transaction

log = Logger()


class Channel:
    """
    One open channel of a connection.

    @ivar consumers: consumer tag -> its consumer, in the order they started
        (L{ChannelConsumers}).
    @ivar deliveries: the channel's L{Deliveries}: delivery tags, un-acked
        deliveries, and what holds its consumers back.
    @ivar consumer_prefetch: the per-consumer limit given to consumers created
        from now on (basic.qos without global).
    @ivar messages_published: messages the vhost took (routed or not), transactional
        ones once committed.
    @ivar messages_acked: deliveries the client acked.
    @ivar messages_unroutable_dropped: publishes no queue took, not mandatory (dropped).
    @ivar messages_unroutable_returned: mandatory publishes no queue took (returned to
        the publisher).
    """

    def __init__(self, connection, channel_id, peer):
        self.connection = connection
        self.id = channel_id
        self.peer = peer
        self.vhost = connection.vhost
        self.access = connection.access or UNCHECKED  # UNCHECKED: made in-process, without a login
        # Exchanges published to:
        self._writable_exchanges = None if connection.access is None else set()
        self._topic_rules = self.access.topic_rules  # empty while the user has no topic permission
        self.clock = connection.broker.clock
        self.consumers = ChannelConsumers(self)
        self.deliveries = Deliveries(connection)
        self.consumer_prefetch = 0
        self.closed = False
        self.messages_published = self.messages_acked = 0
        self.messages_unroutable_dropped = self.messages_unroutable_returned = 0
        self._last_queue_name = None
        self._confirms = None  # PublisherConfirms in confirm mode
        self._transaction = None  # Transaction in tx mode

    def __repr__(self):
        return f"<Channel {self.id} of {self.connection!r}>"

    @property
    def name(self):
        """
        RabbitMQ's name for it, its connection's and its number:
        C{"127.0.0.1:54321 -> 127.0.0.1:5672 (1)"}.
        """
        return f"{self.connection.name} ({self.id})"

    @property
    def prefetch_count(self):
        """
        The channel-wide limit of un-acked deliveries to consumers (basic.qos
        with global; 0: no limit).
        """
        return self.deliveries.prefetch_count

    @property
    def flow_active(self):
        """
        False while the client has paused deliveries (channel.flow), and once
        the channel closed.
        """
        return self.deliveries.flowing

    @property
    def messages_delivered(self):
        """
        Messages handed to consumers or taken by basic.get: as many as the
        delivery tags given out.
        """
        return self.deliveries.given

    @property
    def messages_redelivered(self):
        """Deliveries and gets of messages flagged redelivered."""
        return self.deliveries.redelivered

    @property
    def messages_received_confirm(self):
        """Publishes made in confirm mode (each got a sequence number)."""
        return self._confirms.published if self._confirms is not None else 0

    @property
    def messages_confirmed(self):
        """Publishes in confirm mode whose confirm (ack or nack) was sent."""
        return self._confirms.confirmed if self._confirms is not None else 0

    @property
    def in_confirm_mode(self):
        return self._confirms is not None

    @property
    def transaction(self):
        """The L{Transaction} in tx mode (to read), else None."""
        return self._transaction

    @property
    def unacked_deliveries(self):
        """
        Delivery tag -> un-acked entry, in tag order (read it; settle through
        the basic methods).
        """
        return self.deliveries.unacked

    @property
    def unacked_count(self):
        return len(self.deliveries.unacked)

    @property
    def transaction_bytes(self):
        """Body bytes of the publishes waiting for tx.commit (counted against the watermark)."""
        transaction = self._transaction
        return 0 if transaction is None else transaction.held_bytes

    # -- topology

    def exchange_declare(
        self, exchange, type_name="direct", passive=False, durable=False, auto_delete=False,
        internal=False, arguments=None,
    ):
        check_arguments(arguments)
        if not passive and exchange:
            self.access.check_configure("exchange", exchange)
        self.vhost.declare_exchange(
            exchange, type_name, passive, durable, auto_delete, internal, arguments
        )

    def exchange_delete(self, exchange, if_unused=False):
        if exchange:
            self.access.check_configure("exchange", exchange)
        self.vhost.delete_exchange(exchange, if_unused)

    def exchange_bind(self, destination, source, routing_key="", arguments=None):
        """exchange.bind: what C{source} routes under this binding goes on to C{destination}."""
        check_arguments(arguments)
        self.access.check_binding("exchange", destination, source, routing_key, self.vhost)
        self.vhost.bind_exchange(destination, source, routing_key, arguments)

    def exchange_unbind(self, destination, source, routing_key="", arguments=None):
        check_arguments(arguments)
        self.access.check_binding("exchange", destination, source, routing_key, self.vhost)
        self.vhost.unbind_exchange(destination, source, routing_key, arguments)

    def queue_declare(
        self, queue="", passive=False, durable=False, exclusive=False, auto_delete=False,
        arguments=None,
    ):
        """Declare a queue; returns C{(name, message_count, consumer_count)}."""
        if queue.startswith(REPLY_QUEUE):  # direct reply-to's names (brokerd.model.replyto)
            declared = self.connection.broker.replies.declare(self, queue)
            self._last_queue_name = queue
            return declared
        check_arguments(arguments)
        queue, server_named = self.access.queue_to_declare(queue, passive, arguments)
        declared = self.vhost.declare_queue(
            self._queue_name(queue) if passive else queue,
            self.connection,
            passive,
            durable,
            exclusive,
            auto_delete,
            arguments,
            server_named,
        )
        self._last_queue_name = declared.name
        return declared.name, declared.message_count, declared.consumer_count

    def queue_bind(self, queue, exchange, routing_key="", arguments=None):
        check_arguments(arguments)
        queue = self._queue_name(queue)
        self.access.check_binding("queue", queue, exchange, routing_key, self.vhost)
        self.vhost.bind(queue, exchange, routing_key, arguments, self.connection)

    def queue_unbind(self, queue, exchange, routing_key="", arguments=None):
        check_arguments(arguments)
        queue = self._queue_name(queue)
        self.access.check_binding("queue", queue, exchange, routing_key, self.vhost)
        self.vhost.unbind(queue, exchange, routing_key, arguments, self.connection)

    def queue_purge(self, queue):
        """Drop a queue's ready messages; returns how many."""
        queue = self._queue_name(queue)
        self.access.check_read("queue", queue)
        return self.vhost.purge_queue(queue, self.connection)

    def queue_delete(self, queue, if_unused=False, if_empty=False):
        """Delete a queue; returns how many ready messages went with it."""
        queue = self._queue_name(queue)
        self.access.check_configure("queue", queue)
        return self.vhost.delete_queue(queue, self.connection, if_unused, if_empty)

    def _queue_name(self, name):
        # AMQP: an empty queue name means the last queue declared on this channel.
        if name:
            return name
        if self._last_queue_name is None:
            raise NotFound("no previously declared queue on this channel")
        return self._last_queue_name

    # -- publishing

    def confirm_select(self):
        """Put the channel in confirm mode: publishes are numbered from 1 and confirmed."""
        if self._transaction is not None:
            raise PreconditionFailed("cannot switch from tx to confirm mode")
        if self._confirms is None:
            self._confirms = PublisherConfirms(self.peer, self.vhost.store, self.clock)

    def basic_publish(self, exchange, routing_key, properties, body, mandatory=False):
        """Route and enqueue a message; returns it to the publisher if mandatory and unroutable."""
        check_short_string("routing key", routing_key)
        self.publish(Message(exchange, routing_key, properties, body), mandatory)

    def publish(self, message, mandatory=False):
        """
        L{basic_publish} for a message the adapter has built (routing key already checked).

        Properties that did not come as AMQP bytes are checked first, so that nothing is
        kept (not even by a transaction) that either protocol could not deliver.
        """
        if message.encoded_properties is None:
            check_properties(message.properties)
        writable = self._writable_exchanges  # None: unchecked; else exchanges checked already
        if writable is not None and (
            message.exchange not in writable or message.properties.user_id
        ):
            self.access.check_publish(message, writable)
        if self._topic_rules:
            self.access.check_topic_write(self.vhost, message)
        if message.properties.reply_to == REPLY_QUEUE:
            message = self.connection.broker.replies.with_reply_address(self, message)
        transaction = self._transaction
        if transaction is not None and transaction.committing is None:
            transaction.hold_publish(self.publish, (message, mandatory), len(message.body))
            return
        confirms = self._confirms
        if confirms is not None:
            sequence = confirms.next_sequence()
        routed, stored, refused = self.vhost.publish(message.exchange, message)
        self.messages_published += 1
        if (firehose := self.vhost.firehose) is not None:
            firehose.published(message, self.connection.name, self.id, self.connection.user or "")
        # One test on the routed path, as before; the counting is on the unroutable one only.
        if not routed:
            if reply := message.routing_key.startswith(REPLY_PREFIX) and not message.exchange:
                # And RabbitMQ returns it if mandatory:
                self.connection.broker.replies.deliver(self.vhost, message)
            if mandatory and not refused:
                self.messages_unroutable_returned += 1
                self.peer.returned(312, "NO_ROUTE", message)
            elif not refused and not reply:
                self.messages_unroutable_dropped += 1
        if confirms is not None:
            if refused:
                # A full queue with x-overflow reject-publish said no.
                confirms.confirm(sequence, ack=False)
            elif stored:
                confirms.confirm_after_sync(sequence)
            else:
                confirms.confirm(sequence)
        elif transaction is not None:  # its commit runs this publish
            transaction.committing.published(stored, refused)

    # -- consuming

    def basic_qos(self, prefetch_count, global_=False):
        if global_:
            self.deliveries.prefetch_count = prefetch_count
            self.dispatch_all()
        else:
            self.consumer_prefetch = prefetch_count

    def basic_consume(self, queue, consumer_tag="", no_ack=False, exclusive=False, arguments=None):
        """
        Start a consumer; returns its tag.

        Deliveries start on the next reactor turn, after the adapter has had
        the chance to confirm the consumer to its client.
        """
        check_arguments(arguments)
        queue = self._queue_name(queue)
        if queue == REPLY_QUEUE:
            # The arguments are ignored.
            target, arguments = self.connection.broker.replies.reply_queue(self, no_ack), None
        else:
            self.access.check_read("queue", queue)
            target = self.vhost.queue(queue, self.connection)
            target.check_available()
        return self.consumers.start(target, consumer_tag, no_ack, exclusive, arguments)

    def basic_cancel(self, consumer_tag):
        """Stop a consumer; its un-acked deliveries stay un-acked. Unknown tags are ignored."""
        self.consumers.cancel(consumer_tag)

    def basic_get(self, queue, no_ack=False):
        """
        Take one message without a consumer.

        @return: None if the queue is empty, else C{(delivery_tag, redelivered,
            message, message_count)} where the count is what is left ready.
        """
        queue = self._queue_name(queue)
        self.access.check_read("queue", queue)
        source = self.vhost.queue(queue, self.connection)
        source.check_available()
        entry = source.get()
        if entry is None:
            # The head could not be read from the store: not empty, unavailable.
            source.check_available()
            self.deliveries.found_none()
            return None
        tag = self.deliveries.give_got(entry, no_ack)
        if no_ack:
            source.forget(entry)
        message = delivered_message(entry)
        if (firehose := self.vhost.firehose) is not None:
            trace_delivery(firehose, self, queue, entry.redelivered, message)
        return tag, entry.redelivered, message, source.message_count

    def flow(self, active):
        """Pause (False) or resume (True) deliveries to this channel's consumers."""
        self.deliveries.flowing = active
        if active:
            self.dispatch_all()
        return active

    # -- settling deliveries

    def basic_ack(self, delivery_tag, multiple=False):
        if self._holds_for_commit():
            self._transaction.hold_settlement(
                self.basic_ack, (delivery_tag, multiple), delivery_tag, multiple
            )
            return
        deliveries = self.deliveries
        entries = deliveries.take(delivery_tag, multiple)
        self.messages_acked += len(entries)
        for entry in entries:
            entry.queue.acked(entry)
        self._refill(deliveries.release(entries))

    def basic_nack(self, delivery_tag, multiple=False, requeue=True):
        if self._holds_for_commit():
            self._transaction.hold_settlement(
                self.basic_nack, (delivery_tag, multiple, requeue), delivery_tag, multiple
            )
            return
        self._settle_refused(self.deliveries.take(delivery_tag, multiple), requeue)

    def basic_reject(self, delivery_tag, requeue=True):
        if self._holds_for_commit():
            self._transaction.hold_settlement(
                self.basic_reject, (delivery_tag, requeue), delivery_tag, False
            )
            return
        self._settle_refused(self.deliveries.take(delivery_tag, False), requeue)

    def basic_recover(self, requeue=True):
        """
        Send every un-acked delivery again: requeued for any consumer, or (with
        C{requeue} false) redelivered to the consumer that had it, where it
        still exists.
        """
        entries = self.deliveries.take_all()
        if not requeue:
            entries = self.consumers.redeliver(entries, self.deliveries)
        self._settle_refused(entries, True)

    def _settle_refused(self, entries, requeue):
        """
        Give C{entries}, taken from the deliveries, back to their queues with
        C{requeue}, else reject them there (dead-lettered or dropped).
        """
        queues = self.deliveries.release(entries)
        if requeue:
            by_queue = {}
            for entry in entries:
                by_queue.setdefault(entry.queue, []).append(entry)
            for queue, returned in by_queue.items():
                queue.requeue(returned)
            self.dispatch_all()
        else:
            for entry in entries:
                entry.queue.reject(entry)
            self._refill(queues)

    def _refill(self, queues):
        """
        Let C{queues}, whose consumers got room, deliver again, and with a
        channel-wide limit every queue this channel consumes from. A queue this
        channel no longer consumes from may be among them: a single active
        consumer that was cancelled holding deliveries holds up its successor
        until they are settled.
        """
        if self.deliveries.prefetch_count:
            queues |= self.consumers.queues()
        for queue in queues:
            queue.dispatch()

    def dispatch_all(self):
        """Let every queue this channel consumes from deliver what it can."""
        for queue in self.consumers.queues():
            queue.dispatch()

    # -- transactions

    def tx_select(self):
        """Put the channel in transaction mode: publishes and settlements wait for tx.commit."""
        if self._confirms is not None:
            raise PreconditionFailed("cannot switch from confirm to tx mode")
        if self._transaction is None:
            self._transaction = Transaction(self.connection.inbound, self.deliveries)

    def tx_commit(self):
        """
        Apply the transaction's publishes and settlements, in the order they
        came; a new one begins. Returns the Deferred of its L{CommitOutcome}:
        it fires once the messages the store took are safe (tx.commit-ok
        waits for it, as RabbitMQ's does), or fails with "partial tx
        completion".
        """
        return self._open_transaction().commit(self.vhost.store)

    def tx_rollback(self):
        """
        Drop the transaction's publishes and settlements (the deliveries stay
        un-acked); a new one begins.
        """
        self._open_transaction().rollback()

    def _holds_for_commit(self):
        """In tx mode, outside the commit that runs what it held."""
        transaction = self._transaction
        return transaction is not None and transaction.committing is None

    def _open_transaction(self):
        if self._transaction is None:
            raise PreconditionFailed("channel is not transactional")
        return self._transaction

    # -- closing

    def close(self):
        """
        Cancel every consumer, requeue every un-acked delivery, roll back a
        transaction, stop confirming.
        """
        if self.closed:
            return
        self.closed = True
        self.deliveries.flowing = False
        self.consumers.cancel_all()
        self._settle_refused(self.deliveries.take_all(), True)
        if self._transaction is not None:
            self._transaction.rollback()
        if self._confirms is not None:
            self._confirms.discard()
