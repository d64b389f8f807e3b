"""What a workload client keeps and logs whatever AMQP library carries its frames: the pika clients
(L{spark_jobs.clients}) and the pipelining ones (L{spark_jobs.fast_clients}) are a connection life on top of
these books, so both log the same events, count the same counters and settle alike.

A publisher's book logs each publish and tracks its delivery tag until the
broker answers it; a consumer's book logs each delivery, decides its settle
(L{spark_jobs.plan.settle_decision}) and logs that. Every client counts its
CPU time from the moment it is ready to its end (L{CPU_MS}), so the run can
tell whether the broker or its clients were the limit.
"""

import hashlib
import pathlib
import time
import traceback

from spark_jobs import events
from spark_jobs.control import ACKED, BROKER_NACKED, CONFIRMED, CPU_MS, DELIVERED, NACKED, REJECTED, EventLog
from spark_jobs.plan import build_topology, publisher_message_count, publisher_messages, settle_decision
from spark_jobs.settings import WorkloadSettings


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


def run_client(client):
    """Runs C{client} (in its own process) to its end; a failure is reported to the runner, then raised."""
    try:
        client.run()
    except BaseException as failure:
        client.control.report_failure(client.name, "".join(traceback.format_exception(failure)).rstrip())
        raise


class ClientBook:
    """
    One client's identity, plan and event log, and the connection it is on.

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
        self.cpu_from = None

    def counter_row(self):
        """This client's row of the run's counters."""
        raise NotImplementedError

    def record(self, kind, fields):
        self.log.write(kind, self.session, self.epoch, fields)

    def ready(self):
        """The first session is set up: count CPU from here, and tell the runner."""
        if self.session == 0:
            self.cpu_from = time.process_time()
            self.control.client_ready()

    def close_book(self):
        """The client ends: close its log and count the CPU it used since it was ready."""
        self.log.close()
        if self.cpu_from is not None:
            self.control.count(self.row, CPU_MS, round((time.process_time() - self.cpu_from) * 1000))


class PublisherBook(ClientBook):
    """A publisher's planned messages, what it sent, and the delivery tags still waiting for a confirm."""

    role = "publisher"

    def __init__(self, config, control, number):
        super().__init__(config, control, number)
        self.messages = publisher_messages(self.settings, self.topology, number)
        self.total = publisher_message_count(self.settings, number)
        self.sent = 0
        self.unconfirmed = {}  # delivery tag -> (seq, message id), in tag order
        self.oldest_tag = 1
        self.next_tag = 1
        self.confirm = self.settings.confirm
        self.priorities = self.settings.max_priority > 0

    def counter_row(self):
        return self.number

    def new_channel(self):
        """A new channel numbers its publishes from 1 again."""
        self.unconfirmed.clear()
        self.oldest_tag = self.next_tag = 1

    def channel_lost(self):
        """What was unconfirmed stays unconfirmed: it may or may not have been stored."""
        self.unconfirmed.clear()
        if self.sent == self.total:
            self.finished = True

    def published(self, message):
        """Logs C{message} as published now, waiting for the next delivery tag's confirm."""
        body = message.body
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

    def confirmed(self, last, multiple, ok):
        """
        The broker's basic.ack (C{ok}) or basic.nack of tag C{last}, or of
        every tag up to it (C{multiple}): logs each answered publish.

        @raise ConfirmOutOfOrder: the tags answered are not waiting.
        """
        first = self.oldest_tag if multiple else last
        if not self.oldest_tag <= first <= last < self.next_tag:
            raise ConfirmOutOfOrder(f"confirm of tag {last} (multiple={multiple}) while tags {self.oldest_tag}.."
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


class ConsumerBook(ClientBook):
    """
    A consumer's deliveries and how it settles each. How often a delivery came
    back before is the broker's x-delivery-count header when it sends one
    (brokerd does on every redelivery); a broker that does not (RabbitMQ's
    classic queues) gets the count of this consumer's own nacks of that
    message from that queue instead (L{returns_before}).

    @ivar own_returns: C{(message id, queue)} -> how often this consumer nacked it with requeue.
    """

    role = "consumer"

    def __init__(self, config, control, number):
        super().__init__(config, control, number)
        self.own_returns = {}

    def counter_row(self):
        return self.settings.publishers + self.number

    def consumer_tags(self):
        """C{(consumer tag, queue)} of each consumed queue: the tag names the queue its deliveries come from."""
        return [(f"{self.name}/{queue}", queue) for queue in self.topology.queues]

    def delivered(self, queue, identifier, delivery_tag, redelivered, headers, body):
        """
        Logs one delivery and the settle decided for it (ack, nack with
        requeue or reject); returns that decision (an L{events} kind), for
        the caller to send.
        """
        self.record(events.DELIVER, {
            "message_id": identifier,
            "queue": queue,
            "consumer": self.number,
            "delivery_tag": delivery_tag,
            "redelivered": bool(redelivered),
            "delivery_count": int(headers.get("x-delivery-count", 0)) if headers else 0,
            "size": len(body),
            "body_sha256": hashlib.sha256(body).hexdigest(),
        })
        self.control.count(self.row, DELIVERED)
        key = (identifier, queue)
        decision = settle_decision(self.settings, identifier, queue, returns_before(headers, self.own_returns.get(key, 0)))
        if decision == events.NACK:
            self.own_returns[key] = self.own_returns.get(key, 0) + 1
        counter = {events.ACK: ACKED, events.NACK: NACKED, events.REJECT: REJECTED}[decision]
        self.record(decision, {"message_id": identifier, "queue": queue, "consumer": self.number,
                               "requeue": decision == events.NACK})
        self.control.count(self.row, counter)
        return decision
