"""The event logs the workload's clients keep, whichever AMQP library carries
their frames (pika in L{spark_jobs.pika_clients}, the pipelining client in
L{spark_jobs.fast_clients}), so that both log the same events, count the same
counters and settle alike.

An L{EventLog} writes one client's event file. A L{ClientLog} is what every
client records of its life: its events, stamped with the session and broker
epoch they happened in, its row of the run's counters, and its CPU time from
the moment it is ready to its end (L{spark_jobs.control.CPU_MS}), so the run
can tell whether the broker or its clients were the limit. A publisher's
L{PublisherLog} logs each publish and tracks its delivery tag until the
broker answers it; a consumer's L{ConsumerLog} logs each delivery, decides
its settle (L{spark_jobs.plan.settle_decision}) and logs that.
"""

import hashlib
import itertools
import json
import pathlib
import time

from spark_jobs import events
from spark_jobs.control import (
    ACKED,
    BROKER_NACKED,
    CONFIRMED,
    CPU_MS,
    DELIVERED,
    NACKED,
    REJECTED,
    SESSIONS,
)
from spark_jobs.plan import publisher_message_count, publisher_messages, settle_decision


class ConfirmOutOfOrder(ValueError):
    """The broker confirmed a delivery tag that is not waiting for an answer."""


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


class ClientLog:
    """
    What one client records of its life: its events (an L{EventLog}), each
    stamped with the session and broker epoch it happened in, its row of the
    run's counters, and its CPU time from the moment it is ready to its end.

    @ivar name: the client's name (C{publisher-0}, C{consumer-3}), which its event file has too.
    @ivar session: the current connection's number, from 0; -1 before the first.
    @ivar epoch: the broker incarnation the current connection talks to.
    """

    def __init__(self, config, control, name, row):
        """
        @param config: the run's L{spark_jobs.clients.ClientConfig} (its events directory and
            label).
        @param control: the run's L{spark_jobs.control.RunControl}.
        @param row: this client's row of the run's counters.
        """
        self.name = name
        self._control = control
        self._row = row
        self._events = EventLog(pathlib.Path(config.events_dir) / f"{name}.jsonl", config.backend,
                                name)
        self.session = -1
        self.epoch = -1
        self._cpu_from = None

    @classmethod
    def of_publisher(cls, config, control, number):
        """Publisher C{number}'s log: publishers have the first rows of the counters."""
        return cls(config, control, f"publisher-{number}", number)

    @classmethod
    def of_consumer(cls, config, control, settings, number):
        """Consumer C{number}'s log: its row comes after the C{settings}' publishers'."""
        return cls(config, control, f"consumer-{number}", settings.publishers + number)

    def new_session(self, epoch):
        """A connection to broker incarnation C{epoch} is open: later events are the next
        session's."""
        self.session += 1
        self.epoch = epoch
        self._control.count(self._row, SESSIONS)

    def write(self, kind, fields):
        """One event of C{kind} in the current session (C{fields} as L{EventLog.write} takes
        them)."""
        self._events.write(kind, self.session, self.epoch, fields)

    def count(self, counter, amount=1):
        """Adds C{amount} to one of this client's counters (L{spark_jobs.control.COUNTER_NAMES})."""
        self._control.count(self._row, counter, amount)

    def ready(self):
        """The first session is set up: count CPU from here, and tell the runner."""
        if self.session == 0:
            self._cpu_from = time.process_time()
            self._control.client_ready()

    def close(self):
        """The client ends: close its event file and count the CPU it used since it was ready."""
        self._events.close()
        if self._cpu_from is not None:
            self.count(CPU_MS, round((time.process_time() - self._cpu_from) * 1000))


class PublisherLog:
    """
    A publisher's planned messages, the publishes and confirms it logs, and
    the delivery tags still waiting for the broker's answer (without confirm
    mode: the publishes since the last round-trip barrier).

    @ivar total: how many messages this publisher publishes in all.
    @ivar sent: how many of them it published so far, in every session.
    """

    def __init__(self, log, settings, topology, number):
        """
        @param log: the publisher's L{ClientLog}, which the events go to.
        @param settings: the run's L{spark_jobs.settings.WorkloadSettings}.
        @param topology: the plan's L{spark_jobs.plan.Topology} of C{settings}.
        """
        self._log = log
        self._number = number
        self._confirm = settings.confirm
        self._messages = publisher_messages(settings, topology, number)
        self.total = publisher_message_count(settings, number)
        self.sent = 0
        self._unanswered = {}  # delivery tag -> (seq, message id), in tag order
        self._oldest_tag = 1
        self._next_tag = 1

    @property
    def unanswered(self):
        """How many publishes wait for the broker's answer."""
        return len(self._unanswered)

    @property
    def all_sent(self):
        """Every planned message was published."""
        return self.sent == self.total

    @property
    def all_answered(self):
        """Every planned message was published and none waits for an answer any more."""
        return self.sent == self.total and not self._unanswered

    def room(self, window):
        """How many more messages may go out now with at most C{window} waiting for an answer."""
        return min(window - len(self._unanswered), self.total - self.sent)

    def next_messages(self, count):
        """The next C{count} planned messages, in order (each to be logged by L{published} once
        sent)."""
        return itertools.islice(self._messages, count)

    def new_channel(self):
        """A new channel numbers its publishes from 1 again."""
        self._unanswered.clear()
        self._oldest_tag = self._next_tag = 1

    def channel_lost(self):
        """What was unconfirmed stays unconfirmed: it may or may not have been stored."""
        self._unanswered.clear()

    def barrier_passed(self):
        """Without confirm mode: the broker answered a round trip, so it has read every publish
        before it."""
        self._unanswered.clear()

    def published(self, message):
        """Logs C{message} as published now, waiting for the next delivery tag's confirm."""
        body = message.body
        self._log.write(events.PUBLISH, {
            "message_id": message.message_id,
            "publisher": self._number,
            "seq": message.seq,
            "exchange": message.exchange,
            "routing_key": message.routing_key,
            "queues": message.queues,
            "size": len(body),
            "body_sha256": hashlib.sha256(body).hexdigest(),
            "priority": message.priority,
            "confirm": self._confirm,
        })
        self._unanswered[self._next_tag] = (message.seq, message.message_id)
        self._next_tag += 1
        self.sent += 1

    def confirmed(self, last, multiple, ok):
        """
        The broker's basic.ack (C{ok}) or basic.nack of tag C{last}, or of
        every tag up to it (C{multiple}): logs each answered publish.

        @raise ConfirmOutOfOrder: the tags answered are not waiting.
        """
        first = self._oldest_tag if multiple else last
        if not self._oldest_tag <= first <= last < self._next_tag:
            raise ConfirmOutOfOrder(f"confirm of tag {last} (multiple={multiple})"
                                    f" while tags {self._oldest_tag}..{self._next_tag - 1}"
                                    f" are unconfirmed")
        answered = 0
        for tag in range(first, last + 1):
            entry = self._unanswered.pop(tag, None)
            if entry is not None:
                seq, identifier = entry
                self._log.write(events.CONFIRM, {
                    "message_id": identifier,
                    "publisher": self._number,
                    "seq": seq,
                    "ok": ok,
                })
                answered += 1
        while self._oldest_tag < self._next_tag and self._oldest_tag not in self._unanswered:
            self._oldest_tag += 1
        self._log.count(CONFIRMED if ok else BROKER_NACKED, answered)


class ConsumerLog:
    """
    A consumer's deliveries and how it settles each. How often a delivery came
    back before is the broker's x-delivery-count header when it sends one
    (brokerd does on every redelivery); a broker that does not (RabbitMQ's
    classic queues) gets the count of this consumer's own nacks of that
    message from that queue instead (L{returns_before}).
    """

    def __init__(self, log, settings, number):
        """
        @param log: the consumer's L{ClientLog}, which the events go to.
        @param settings: the run's L{spark_jobs.settings.WorkloadSettings}, which the settle
            decisions are drawn from.
        """
        self._log = log
        self._settings = settings
        self._number = number
        # (message id, queue) -> how often this consumer nacked it with requeue
        self._own_returns = {}

    def delivered(self, queue, identifier, delivery_tag, redelivered, headers, body):
        """
        Logs one delivery and the settle decided for it (ack, nack with
        requeue or reject); returns that decision (an L{events} kind), for
        the caller to send.
        """
        self._log.write(events.DELIVER, {
            "message_id": identifier,
            "queue": queue,
            "consumer": self._number,
            "delivery_tag": delivery_tag,
            "redelivered": bool(redelivered),
            "delivery_count": int(headers.get("x-delivery-count", 0)) if headers else 0,
            "size": len(body),
            "body_sha256": hashlib.sha256(body).hexdigest(),
        })
        self._log.count(DELIVERED)
        key = (identifier, queue)
        own_returns = self._own_returns
        returns = returns_before(headers, own_returns.get(key, 0))
        decision = settle_decision(self._settings, identifier, queue, returns)
        if decision == events.NACK:
            own_returns[key] = own_returns.get(key, 0) + 1
        counter = {events.ACK: ACKED, events.NACK: NACKED, events.REJECT: REJECTED}[decision]
        self._log.write(decision, {
            "message_id": identifier,
            "queue": queue,
            "consumer": self._number,
            "requeue": decision == events.NACK,
        })
        self._log.count(counter)
        return decision


class EventLog:
    """
    One client's event file (JSON lines, as L{spark_jobs.events} says), written
    through a large buffer so logging does not slow the client down. Every
    line gets the common fields, C{n} counting up from 0 and C{t} now, then the
    kind's fields (L{events.KIND_FIELDS}) in order.

    Lines are put together from one %-template per kind rather than by
    C{json}: a client writes two or three lines per message, and this is
    several times faster. Strings are escaped as JSON requires, so a message id
    from the wire cannot break a line.
    """

    def __init__(self, path, backend, client):
        self._file = open(path, "w", encoding="utf-8", buffering=1 << 20)
        self._identity = f'"backend":{_escape(backend)},"client":{_escape(client)},'
        self._formats = {kind: _formatter(kind) for kind in events.EVENT_KINDS}
        self._session = None
        self._prefix = None
        self.n = 0

    def write(self, kind, session, epoch, fields):
        """One event of C{kind}; C{fields} holds (at least) the kind's fields."""
        if self._session != (session, epoch):
            self._session = (session, epoch)
            self._prefix = f'{self._identity}"session":{int(session)},"epoch":{int(epoch)},'
        head, encode = self._formats[kind]
        self._file.write(f'{head}{self._prefix}"n":{self.n},"t":{time.time()!r}{encode(fields)}')
        self.n += 1

    def close(self):
        self._file.close()


_escape = json.encoder.encode_basestring_ascii
_JSON_BOOLEANS = {False: "false", True: "true"}


def _names(values):
    """A JSON list of names (the queues of a publish)."""
    return "[" + ",".join(map(_escape, values)) + "]"


# Per field type: the %-conversion of its value, and the expression (of the value's
# expression) that makes the value that conversion takes.
_CONVERSIONS = {
    str: ("%s", "escape({})"),
    int: ("%d", "{}"),
    float: ("%r", "float({})"),
    bool: ("%s", "booleans[bool({})]"),
    list: ("%s", "names({})"),
}


def _formatter(kind):
    """
    The opening of C{kind}'s lines, and a function of an event's fields to the
    rest of its line: one %-formatting of a tuple built in one expression, made
    once per kind from L{events.KIND_FIELDS} (names from there only, never from
    the wire), so a line costs one Python call rather than one per field.
    """
    names = events.KIND_FIELDS[kind]
    conversions = [_CONVERSIONS[events.EVENT_FIELDS[name]] for name in names]
    template = "".join(f',"{name}":{conversion}'
                       for name, (conversion, _) in zip(names, conversions)) + "}\n"
    values = ", ".join(make.format(f"fields[{name!r}]")
                       for name, (_, make) in zip(names, conversions))
    encode = eval(  # noqa: S307 - a fixed expression of known names
        f"lambda fields: template % ({values},)",
        {"template": template, "escape": _escape, "booleans": _JSON_BOOLEANS, "names": _names})
    return f'{{"kind":{_escape(kind)},', encode
