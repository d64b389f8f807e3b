"""Dead-lettering: a message a queue gives up on is republished to its dead-letter exchange.

A message dies when it is rejected or nacked without requeue, expires, is
pushed out by a length limit, or is returned more often than the queue's
delivery limit allows. If the queue has a dead-letter exchange
(``x-dead-letter-exchange`` or its policy's), a copy goes there, its
``x-death`` header saying why, as RabbitMQ writes it: a list of
tables, most recently updated first, one per (queue, reason), each with ``count``,
``reason``, ``queue``, ``time``, ``exchange``, ``routing-keys`` and, if the
message had one, ``original-expiration`` (the copy loses its ``expiration``
so it does not die again of the same TTL). ``x-first-death-*`` and
``x-last-death-*`` headers name the first and latest death.

A dead letter is not put into a queue it already died in with no rejection
since (a cycle of expiries or overflows), as RabbitMQ: it would otherwise go
round for ever; the other queues its route reaches still get it.

A queue hands its dying entries to its L{QueueDeadLetters}, which also
pushes the oldest ones out of a drop-head queue over its length limits.
"""

import datetime

from twisted.logger import Logger

from brokerd.model.delayeddelivery import delay_of
from brokerd.model.message import Message
from brokerd.model.paging import STORE_FAILURES
from brokerd.proto import messages_pb2
from brokerd.proto.tables import dict_to_table, value_to_python

log = Logger()

REJECTED = "rejected"
EXPIRED = "expired"
MAXLEN = "maxlen"
DELIVERY_LIMIT = "delivery_limit"
DEATH_HEADERS = ("x-death", "x-first-death-queue", "x-first-death-reason", "x-first-death-exchange",
                 "x-last-death-queue", "x-last-death-reason", "x-last-death-exchange")


class QueueDeadLetters:
    """
    The messages one queue gives up on: each goes to the queue's dead-letter
    exchange if it has one (read back from the store first if the queue kept
    only its handle), and the queue forgets it.
    """

    def __init__(self, queue, pager, clock):
        self._queue = queue
        self._pager = pager
        self._clock = clock

    def died(self, entry, reason):
        """
        C{entry} died in the queue for C{reason}: dead-lettered if the queue
        says where, then forgotten.
        """
        queue = self._queue
        if queue.policy.dead_letter_exchange is not None:
            if entry.message is None and not self._load(entry):
                return
            try:
                dead_letter(queue, entry.message, reason, self._clock.seconds())
            except Exception:  # the message is gone from the queue whatever happened there
                log.failure("queue {queue!r} in vhost {vhost!r}: dead-lettering a message failed",
                            queue=queue.name, vhost=queue.vhost.name)
        queue.forget(entry)

    def refused(self, message):
        """
        A message the full queue refused: with x-overflow reject-publish-dlx it
        is dead-lettered.
        """
        queue = self._queue
        if queue.policy.overflow == "reject-publish-dlx":
            dead_letter(queue, message, MAXLEN, self._clock.seconds())

    def drop_overflow(self, ready):
        """
        x-overflow drop-head: a queue over its length limits loses its oldest
        messages, the head of C{ready} (its L{brokerd.model.ready.ReadyList}).
        """
        policy = self._queue.policy
        while ready and (
            (policy.max_length is not None and len(ready) > policy.max_length)
            or (policy.max_length_bytes is not None and ready.bytes > policy.max_length_bytes)
        ):
            # The head, as RabbitMQ drops: in a priority queue, the highest priority.
            entry = ready.popleft()
            self.died(entry, MAXLEN)

    def _load(self, entry):
        """
        Load the message of a paged-out entry; False if it cannot be read (it
        is then forgotten).
        """
        try:
            return self._pager.page_in(entry)
        except STORE_FAILURES as problem:
            log.error(
                "queue {queue!r}: a message to dead-letter cannot be read: {problem}; dropped",
                queue=self._queue.name, problem=problem,
            )
            self._queue.forget(entry)
            return False


def dead_letter(queue, message, reason, now):
    """
    Republish C{message}, which died in C{queue} for C{reason}, to the queue's
    dead-letter exchange; C{now} is the time in seconds since the epoch.

    @return: True if it was republished, False if it was dropped (no
        dead-letter exchange, a missing one, or a cycle).
    """
    policy = queue.policy
    if policy.dead_letter_exchange is None:
        return False
    vhost = queue.vhost
    if vhost.exchanges.get(policy.dead_letter_exchange) is None:
        log.warn(
            "queue {queue!r} in vhost {vhost!r}: dead-letter exchange {exchange!r} does not exist;"
            " message dropped",
            queue=queue.name, vhost=vhost.name, exchange=policy.dead_letter_exchange,
        )
        return False
    headers = {field.name: field for field in message.properties.headers.fields}
    deaths = value_to_python(headers["x-death"].value) if "x-death" in headers else []
    if not isinstance(deaths, list):
        deaths = []
    properties = messages_pb2.BasicProperties()
    properties.CopyFrom(message.properties)
    original_expiration = properties.expiration if properties.HasField("expiration") else None
    properties.ClearField("expiration")
    death = {
        "count": 1,
        "reason": reason,
        "queue": queue.name,
        "time": datetime.datetime.fromtimestamp(int(now), datetime.timezone.utc),
        "exchange": message.exchange,
        "routing-keys": [message.routing_key],
    }
    if original_expiration is not None:
        death["original-expiration"] = original_expiration
    for earlier in deaths:
        if (
            isinstance(earlier, dict)
            and earlier.get("queue") == queue.name
            and earlier.get("reason") == reason
        ):
            # As RabbitMQ: the entry of an earlier death here for the same
            # reason only counts one more (its exchange, routing keys, time and
            # original expiration stay) and moves to the front.
            death = dict(earlier, count=_count_of(earlier) + 1)
            deaths.remove(earlier)
            break
    kept = [field for field in properties.headers.fields if field.name not in DEATH_HEADERS]
    first = {name: headers[name] for name in DEATH_HEADERS[1:4] if name in headers}
    del properties.headers.fields[:]
    properties.headers.fields.extend(kept)
    deaths = [death, *deaths]
    new_headers = {"x-death": deaths}
    if first:
        properties.headers.fields.extend(first.values())
    else:
        new_headers.update({"x-first-death-queue": queue.name, "x-first-death-reason": reason,
                            "x-first-death-exchange": message.exchange})
    new_headers.update({"x-last-death-queue": queue.name, "x-last-death-reason": reason,
                        "x-last-death-exchange": message.exchange})
    dict_to_table(new_headers, properties.headers)
    routing_key = policy.dead_letter_routing_key
    dead = Message(
        policy.dead_letter_exchange,
        message.routing_key if routing_key is None else routing_key,
        properties,
        message.body,
    )
    exchange = vhost.exchanges[policy.dead_letter_exchange]

    def accepts(target):
        if _in_cycle(deaths, target.name):
            log.warn(
                "queue {queue!r} in vhost {vhost!r}: a message dead-lettered ({reason})"
                " into queue {target!r}, where it died before with no rejection since,"
                " is dropped there",
                queue=queue.name, vhost=vhost.name, reason=reason, target=target.name,
            )
            return False
        return True

    if exchange.delayed:
        milliseconds = delay_of(dead)
        # Held until due, as the delayed-message plugin's exchange holds a dead letter:
        if milliseconds is not None:
            vhost.delays.delay(vhost, exchange, dead, milliseconds)
            return True
    vhost.route_now(exchange, dead, accepts)  # an internal exchange takes dead letters too
    return True


def _count_of(death):
    """The count of an earlier x-death entry; a publisher may have written anything there, and a
    count that is not a whole number reads as 0, and one at the 64-bit limit stays there, rather
    than failing."""
    count = death.get("count", 0)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        return 0
    return min(count, _LARGEST_COUNT - 1)


_LARGEST_COUNT = 2**63 - 1  # a field-table long-long; one more would not fit


def _in_cycle(deaths, queue_name):
    """
    True if the message died in C{queue_name} (this death included) and no
    death since was a rejection.
    """
    for death in deaths:  # most recent first
        if not isinstance(death, dict):
            continue
        if death.get("reason") == REJECTED:
            return False
        if death.get("queue") == queue_name:
            return True
    return False
