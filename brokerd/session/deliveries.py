"""The deliveries of one channel: whether it may deliver now, the tags it gives out,
what is not settled yet.

A channel delivers in two ways: its consumers (L{brokerd.session.consumer.Consumer})
deliver on its behalf as their queues hand them messages, and basic.get delivers
through the channel itself. Both number their deliveries here and leave the ones
the client must settle here, under their tags, until the channel settles them (ack,
nack, reject, recover, close). What holds every consumer of the channel back is
kept here as well, so that a consumer asks one object whether it may take a
delivery: channel.flow, the connection's paused writes, and the channel-wide
prefetch count (basic.qos with global) against what its consumers hold.
"""

from collections import OrderedDict, deque

from brokerd.errors import PreconditionFailed


# The most timeout-check marks a channel keeps (see Deliveries.overdue).
MAX_TAG_MARKS = 64


class Deliveries:
    """
    The delivery tags of one channel and the deliveries under them not yet settled.

    A delivery kept here is a L{brokerd.model.message.QueuedMessage} entry; one a
    consumer holds is marked with it here (C{entry.consumer}) until it is
    released, and the consumer counts what it holds itself
    (L{brokerd.session.consumer.Consumer.unacked}), for its own prefetch limit.

    @ivar unacked: delivery tag -> un-acked entry, in tag order. Read it; it
        changes through L{hold}, L{hold_for_consumer}, L{take} and L{take_all}.
    @ivar prefetch_count: the most un-acked deliveries the channel's consumers
        may hold together (0: no limit), as the channel's basic.qos with global
        sets it. As in RabbitMQ, messages taken with basic.get do not count.
    @ivar flowing: False while the channel's client has paused its deliveries
        (channel.flow), and once the channel has closed; the channel sets it.
    """

    __slots__ = (
        "unacked", "prefetch_count", "flowing", "_connection", "_next_tag", "_held_by_consumers",
        "_redelivered", "_tag_marks", "messages_delivered_no_ack", "messages_got_manual_ack",
        "messages_got_no_ack", "gets_empty",
    )

    def __init__(self, connection):
        """
        @param connection: the channel's L{brokerd.session.connection.Connection},
            whose C{deliveries_paused} holds every delivery back while its client
            is not reading.
        """
        self._connection = connection
        self.unacked = OrderedDict()
        self.prefetch_count = 0
        self.flowing = True
        self._next_tag = 1
        # What its consumers hold un-acked, cancelled ones' too: what the limit counts.
        self._held_by_consumers = 0
        self._redelivered = 0
        # For RabbitMQ's deliver_no_ack (counted by give_tag), get, get_no_ack (give_got) and
        # get_empty (found_none); read them.
        self.messages_delivered_no_ack = 0
        self.messages_got_manual_ack = self.messages_got_no_ack = self.gets_empty = 0
        # (time, next tag then) at each timeout check: no delivery is timed per message.
        self._tag_marks = deque()

    @property
    def given(self):
        """
        Delivery tags given out so far: the messages handed to consumers or
        taken by basic.get.
        """
        return self._next_tag - 1

    @property
    def messages_delivered_manual_ack(self):
        """Messages handed to consumers that ack them: the tags given out but the others."""
        return (self._next_tag - 1 - self.messages_delivered_no_ack - self.messages_got_manual_ack
                - self.messages_got_no_ack)

    @property
    def redelivered(self):
        """Deliveries (to consumers and by basic.get) of messages flagged redelivered."""
        return self._redelivered

    def has_room(self, limited):
        """
        True if one more delivery may go out now: the client has not paused the
        channel, its connection's writes are not paused, and a delivery C{limited}
        by the channel-wide prefetch count stays within it.

        @param limited: True for a consumer that acks and that the channel-wide
            limit holds back (a quorum queue's consumer is not held back by it).
        """
        if not self.flowing or self._connection.deliveries_paused:
            return False
        limit = self.prefetch_count
        return not (limit and limited) or self._held_by_consumers < limit

    def give_tag(self, entry):
        """
        The tag of a delivery of C{entry} to a consumer with no-ack: counted,
        not kept.
        """
        tag = self._next_tag
        self._next_tag = tag + 1
        self.messages_delivered_no_ack += 1
        if entry.redelivered:
            self._redelivered += 1
        return tag

    def give_got(self, entry, no_ack):
        """
        The tag of C{entry} taken by basic.get, counted as a get: kept until
        settled (L{hold}) unless C{no_ack}.
        """
        if not no_ack:
            self.messages_got_manual_ack += 1
            return self.hold(entry)
        tag = self._next_tag
        self._next_tag = tag + 1
        self.messages_got_no_ack += 1
        if entry.redelivered:
            self._redelivered += 1
        return tag

    def found_none(self):
        """A basic.get found nothing to take: counted."""
        self.gets_empty += 1

    def hold(self, entry):
        """
        The tag of a delivery of C{entry} by basic.get that the client must
        settle; it is kept until then.
        """
        tag = self._next_tag
        self._next_tag = tag + 1
        self.unacked[tag] = entry
        if entry.redelivered:
            self._redelivered += 1
        return tag

    def hold_for_consumer(self, entry, consumer):
        """
        L{hold} for a delivery by C{consumer}, which holds it until released;
        counted against L{prefetch_count}.
        """
        tag = self._next_tag
        self._next_tag = tag + 1
        entry.consumer = consumer
        self.unacked[tag] = entry
        self._held_by_consumers += 1
        if entry.redelivered:
            self._redelivered += 1
        return tag

    def take(self, delivery_tag, multiple):
        """
        Remove and return the un-acked entries an ack, nack or reject names:
        C{delivery_tag}'s, and with C{multiple} every one up to it (0: all of them).

        @raise PreconditionFailed: for an unknown tag; nothing is taken then.
        """
        unacked = self.unacked
        if multiple and delivery_tag == 0:
            return self.take_all()
        if delivery_tag not in unacked:
            raise PreconditionFailed(f"unknown delivery tag {delivery_tag}")
        if not multiple:
            return [unacked.pop(delivery_tag)]
        entries = []
        while True:
            tag, entry = unacked.popitem(last=False)
            entries.append(entry)
            if tag == delivery_tag:
                return entries

    def take_all(self):
        """
        Remove and return every un-acked entry, in tag order (basic.recover,
        the channel closing).
        """
        entries = list(self.unacked.values())
        self.unacked.clear()
        return entries

    def release(self, entries):
        """
        C{entries}, taken from here, are settled or on their way back: the
        consumers that held them hold them no longer, which gives them and the
        channel room again. A consumer is told once for each run of its entries
        (L{brokerd.session.consumer.Consumer.released}): a multiple ack's are
        mostly one consumer's.

        @return: the set of queues whose consumers got room.
        """
        queues = set()
        holder, count = None, 0  # the consumer of the current run of entries, and the run's length
        for entry in entries:
            consumer = entry.consumer
            if consumer is None:
                continue
            entry.consumer = None
            if consumer is holder:
                count += 1
                continue
            if holder is not None:
                self._held_by_consumers -= count
                queues.add(holder.released(count))
            holder, count = consumer, 1
        if holder is not None:
            self._held_by_consumers -= count
            queues.add(holder.released(count))
        return queues

    def overdue(self, now, shortest, timeout_of):
        """
        The timeout, in milliseconds, that an un-acked delivery has outlived, or None.

        Called on a timer (L{brokerd.session.ack_timeouts}): each call marks the
        tag given next by C{now}, so that a delivery is known to have been made
        by the first mark past its tag; its age counts from there, never more
        than it is. Deliveries are looked at oldest first, until one younger than
        C{shortest} (seconds, the shortest timeout any could have).

        @param timeout_of: an un-acked entry -> its timeout in milliseconds, or None.
        """
        marks, unacked = self._tag_marks, self.unacked
        if not unacked:
            marks.clear()
            return None
        marks.append((now, self._next_tag))
        oldest = next(iter(unacked))
        while marks[0][1] <= oldest:  # the last mark is past every tag given
            marks.popleft()
        if len(marks) > MAX_TAG_MARKS:
            del marks[1]  # its tags count from the next mark: younger than they are, never older
        index = 0
        for tag, entry in unacked.items():
            while marks[index][1] <= tag:
                index += 1
            age = now - marks[index][0]
            if age < shortest:
                return None
            timeout = timeout_of(entry)
            if timeout is not None and age * 1000 >= timeout:
                return timeout
        return None
