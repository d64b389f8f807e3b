"""The broker: virtual hosts over one store, and recovery at start.

Protocol adapters open L{Connection}s on a broker; everything they do goes
through the connection's channels to the virtual host they opened.
"""

from twisted.logger import Logger

from brokerd.errors import NotAllowed
from brokerd.interfaces import IDelayedMessageStore, IPagingStore, QuarantinedRecord, StoreCorrupted
from brokerd.model.delayeddelivery import DelayScheduler
from brokerd.model.message import Message
from brokerd.model.replyto import ReplyConsumers
from brokerd.model.vhost import VirtualHost
from brokerd.model.watermark import MemoryWatermark
from brokerd.proto import messages_pb2
from brokerd.proto.exchange_types import EXCHANGE_TYPE_NAME
from brokerd.proto.tables import table_to_dict

DEFAULT_VHOST = "/"
TOPOLOGY_RECORDS = (messages_pb2.ExchangeRecord, messages_pb2.QueueRecord, messages_pb2.BindingRecord)

log = Logger()


class Broker:
    """
    Holds the virtual hosts, the store and the clock.

    @ivar clock: an L{IReactorTime} provider used for every timer (a
        L{twisted.internet.task.Clock} in tests).
    @ivar connections: the open client connections (L{brokerd.connection.Connection}),
        each with its client's facts, channels, consumers and counters.
    """

    def __init__(self, store, clock, vhosts=(DEFAULT_VHOST,), watermark=None):
        self.store = store
        self.clock = clock
        self.watermark = watermark if watermark is not None else MemoryWatermark()
        self.vhosts = {}
        self.connections = set()
        self.replies = ReplyConsumers()  # direct reply-to consumers, by the token in their reply name
        self.delays = DelayScheduler(self)
        for name in vhosts:
            self.add_vhost(name)

    def add_vhost(self, name):
        if name not in self.vhosts:
            vhost = self.vhosts[name] = VirtualHost(name, self.store, self.clock, self.watermark)
            vhost.delays = self.delays
        return self.vhosts[name]

    def stop(self):
        """Cancel every timer (queue expiry, x-expires, delayed delivery): the broker is shutting down."""
        self.delays.stop()
        for vhost in self.vhosts.values():
            for queue in vhost.queues.values():
                queue.stop_timers()

    def vhost(self, name):
        """The virtual host C{name}; raises NotAllowed (530), as AMQP's connection.open does."""
        vhost = self.vhosts.get(name or DEFAULT_VHOST)
        if vhost is None:
            raise NotAllowed(f"vhost {name} not found")  # RabbitMQ's text, word for word
        return vhost

    def _recover_messages(self, queue):
        """Enqueue a durable queue's stored messages; a damaged queue is marked unavailable."""
        try:
            queue.restore_delivery_counts(self.store.delivery_counts(queue.key))
            if IPagingStore.providedBy(self.store):
                handles = self.store.recovered_handles(queue.key)
                queue.restore_paged(handles)
                return len(handles)
            recovered = [(Message.from_record(record), handle, redelivered)
                         for handle, record, redelivered in self.store.recover(queue.key)]
        except StoreCorrupted as damage:
            log.error(
                "queue {queue!r} in vhost {vhost!r} is unavailable: {damage}",
                queue=queue.name, vhost=queue.vhost.name, damage=damage,
            )
            queue.vhost.mark_unavailable(queue, str(damage))
            return 0
        for message, handle, redelivered in recovered:
            queue.enqueue(message, handle, redelivered)
        return len(recovered)

    def recover(self):
        """
        Rebuild durable topology and messages from the (opened) store, in queue
        order. Called once at start, before any listener accepts clients.

        A record the store cannot read back, or whose values the model cannot
        take, is quarantined: named in the log and left out, and everything
        else is recovered. A quarantined queue whose name is known comes back
        unavailable, holding its name and stored data until it is deleted.

        @return: a dict with the numbers of exchanges, queues, bindings and
            messages recovered, and of records quarantined.
        """
        counts = {"exchanges": 0, "queues": 0, "bindings": 0, "messages": 0, "unavailable": 0, "quarantined": 0}
        store = self.store
        for record in store.topology():
            if isinstance(record, QuarantinedRecord):
                self._quarantine(record)
                counts["quarantined"] += 1
                continue
            if not isinstance(record, TOPOLOGY_RECORDS):
                raise TypeError(f"store {store.name!r} returned an unknown topology record: {record!r}")
            try:
                self._restore(record, counts)
            except Exception as problem:  # values the model cannot take: that record alone is lost to service
                self._quarantine(_unrestorable(record, problem, store.name))
                counts["quarantined"] += 1
        counts["unavailable"] = sum(len(vhost.unavailable_queues) for vhost in self.vhosts.values())
        if IDelayedMessageStore.providedBy(store):
            self.delays.start()
        log.info(
            "recovered {exchanges} exchanges, {queues} queues ({unavailable} unavailable), {bindings} bindings"
            " and {messages} messages from the {backend} store; {quarantined} records quarantined",
            backend=store.name,
            **counts,
        )
        return counts

    def _restore(self, record, counts):
        """Put one readable topology record back in its vhost (and a queue's messages in the queue)."""
        vhost = self.add_vhost(record.vhost)
        if isinstance(record, messages_pb2.ExchangeRecord):
            vhost.restore_exchange(
                record.name,
                EXCHANGE_TYPE_NAME[record.type],
                record.auto_delete,
                record.internal,
                table_to_dict(record.arguments),
            )
            counts["exchanges"] += 1
        elif isinstance(record, messages_pb2.QueueRecord):
            queue = vhost.restore_queue(record.name, record.auto_delete, table_to_dict(record.arguments))
            counts["messages"] += self._recover_messages(queue)
            counts["queues"] += 1
        else:
            arguments = table_to_dict(record.arguments)
            destination = record.destination_exchange
            if vhost.restore_binding(record.queue, record.exchange, record.routing_key, arguments, destination):
                counts["bindings"] += 1
            else:
                log.warn(
                    "store {backend!r} holds a binding from {exchange!r} to {destination} in vhost {vhost!r}"
                    " whose source or destination it does not hold; skipped",
                    backend=self.store.name,
                    exchange=record.exchange,
                    destination=f"exchange {destination!r}" if destination else f"queue {record.queue!r}",
                    vhost=record.vhost,
                )

    def _quarantine(self, quarantined):
        """
        Log a topology record that cannot be served; a queue whose name is
        known stays, unavailable, so that its name and stored data are kept.
        """
        kind, vhost_name, name = quarantined.kind, quarantined.vhost, quarantined.name
        if name is None:
            what = f"a {kind} whose name cannot be read"
        elif kind == "binding" and len(name) > 3:
            what = f"the binding of exchange {name[0]!r} to exchange {name[3]!r} with routing key {name[2]!r}"
        elif kind == "binding":
            what = f"the binding of exchange {name[0]!r} to queue {name[1]!r} with routing key {name[2]!r}"
        else:
            what = f"{kind} {name!r}"
        if vhost_name is not None:
            what += f" in vhost {vhost_name!r}"
        if kind == "queue" and name is not None and vhost_name is not None:
            vhost = self.add_vhost(vhost_name)
            queue = vhost.queues.get(name)
            if queue is None:
                queue = vhost.restore_queue(name, False, {})
            vhost.mark_unavailable(queue, f"its stored record cannot be read: {quarantined.reason}")
            consequence = "it is unavailable (404) until deleted; its record and messages are kept on disk as they are"
        elif kind == "queue":
            consequence = "it is not served; its record and messages are kept on disk as they are"
        else:
            consequence = "it is not served; its record is kept on disk as it is"
        log.error("quarantined {what}: its stored record ({where}) cannot be used: {reason}; {consequence}",
                  what=what, where=quarantined.where, reason=quarantined.reason, consequence=consequence)


def _unrestorable(record, problem, backend):
    """The L{QuarantinedRecord} of a record that parsed but whose values the model refused."""
    if isinstance(record, messages_pb2.BindingRecord):
        kind, name = "binding", (record.exchange, record.queue, record.routing_key)
        if record.destination_exchange:
            name += (record.destination_exchange,)
    else:
        kind = "exchange" if isinstance(record, messages_pb2.ExchangeRecord) else "queue"
        name = record.name
    reason = f"its values cannot be taken ({problem})"
    return QuarantinedRecord(kind, record.vhost, name, f"in the {backend} store", reason)
