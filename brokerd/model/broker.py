"""The broker: virtual hosts, each over a message store, and recovery at start.

Every vhost keeps its durable state in one store: the broker's own (the one
C{--backend} names), or a store of its own given to L{Broker.add_vhost}.
Routing never crosses vhosts, so a publish commits in its vhost's store alone.
A vhost whose store cannot be opened is unavailable: L{Broker.vhost} refuses
it with 530, naming the damage, while the other vhosts serve.

Protocol adapters open L{connections<brokerd.session.connection.Connection>} on
a broker; everything they do goes through the connection's channels to the
virtual host they opened.

A store commit that fails (a full disk) nacks the publishes it covers; the
broker takes the messages it lost out of their queues before anyone sees them
(L{brokerd.interfaces.ICommitFailures}).
"""

from twisted.logger import Logger

from brokerd.errors import NotAllowed
from brokerd.interfaces import (
    ICommitFailures, IDelayedMessageStore, IPagingStore, QuarantinedRecord, StoreCorrupted,
)
from brokerd.model.counters import MessageCounters
from brokerd.model.delayeddelivery import DelayScheduler
from brokerd.model.disk_alarm import DiskAlarm
from brokerd.model.in_sync_alarm import InSyncAlarm
from brokerd.model.message import Message
from brokerd.model.replyto import ReplyConsumers
from brokerd.model.vhost import VirtualHost
from brokerd.model.watermark import ConnectionMemoryLimits, MemoryWatermark
from brokerd.proto import messages_pb2
from brokerd.proto.exchange_types import EXCHANGE_TYPE_NAME
from brokerd.proto.tables import table_to_dict

DEFAULT_VHOST = "/"
TOPOLOGY_RECORDS = (
    messages_pb2.ExchangeRecord, messages_pb2.QueueRecord, messages_pb2.BindingRecord
)

log = Logger()


class Broker:
    """
    Holds the virtual hosts, their stores and the clock.

    @ivar store: the broker's store: every vhost's unless it has its own.
    @ivar own_stores: vhost name -> the store of a vhost that has its own.
    @ivar unavailable_vhosts: vhost name -> why it cannot be served (its store
        did not open); connections to it are refused.

    @ivar clock: a C{twisted.internet.interfaces.IReactorTime} provider used for
        every timer (a C{twisted.internet.task.Clock} in tests).
    @ivar connections: the open client connections (L{brokerd.session.connection.Connection}),
        each with its client's facts, channels, consumers and counters.
    @ivar counters: the L{MessageCounters}: connections opened and closed, and
        the message counts of closed connections, for totals since start.
    @ivar connection_memory: the L{ConnectionMemoryLimits} every client
        connection is held to (a share of the watermark by default).
    @ivar disk_alarm: the L{DiskAlarm}, which blocks publishers beside the
        memory C{watermark} (never raised unless something measures the disk).
    @ivar in_sync_alarm: the L{InSyncAlarm}, which blocks publishers beside them
        while a cluster's leader has fewer nodes in sync than it needs (never
        raised unless the leader's in-sync set tells it its sizes).
    @ivar on_commit_failed: if set, called with the failure of each failed
        store commit, after its lost messages left their queues.
    """

    def __init__(self, store, clock, vhosts=(DEFAULT_VHOST,), watermark=None, disk_alarm=None):
        self.store = store
        self.clock = clock
        self.watermark = watermark if watermark is not None else MemoryWatermark()
        # What each client connection may hold on its way in (brokerd.wire.connection_memory):
        self.connection_memory = ConnectionMemoryLimits.of_watermark(self.watermark.high)
        self.disk_alarm = disk_alarm if disk_alarm is not None else DiskAlarm()
        self.in_sync_alarm = InSyncAlarm()
        self.on_commit_failed = None
        self.vhosts = {}
        self.connections = set()
        self.counters = MessageCounters()
        # Direct reply-to consumers, by the token in their reply name:
        self.replies = ReplyConsumers()
        self.delays = DelayScheduler(self)
        self.own_stores = {}
        self.unavailable_vhosts = {}
        self._own_delays = {}  # vhost name -> the DelayScheduler of its own store
        # An IVhostStores, given by the service: builds the vhosts' own stores.
        self.vhost_stores = None
        self._watch_commit_failures(store)
        for name in vhosts:
            self.add_vhost(name)

    def add_vhost(self, name, store=None):
        """
        The vhost C{name}, made if new: on the broker's store, or on C{store}
        (opened already), which is then that vhost's alone.
        """
        if name not in self.vhosts:
            if store is None or store is self.store:
                vhost = self.vhosts[name] = VirtualHost(
                    name, self.store, self.clock, self.watermark
                )
                vhost.delays = self.delays
            else:
                vhost = self.vhosts[name] = VirtualHost(name, store, self.clock, self.watermark)
                self.own_stores[name] = store
                self._watch_commit_failures(store)
                vhost.delays = self._own_delays[name] = DelayScheduler(self, store)
            vhost.queue_churn = self.counters.queues
        return self.vhosts[name]

    def _watch_commit_failures(self, store):
        if ICommitFailures.providedBy(store):
            store.watch_commit_failures(self._commit_failed)

    def _commit_failed(self, failure, lost):
        """A store commit failed: the messages of C{lost} (C{(queue key, handle)}) leave their
        queues."""
        by_queue = {}
        for key, handle in lost:
            by_queue.setdefault(key, set()).add(handle)
        for (vhost_name, queue_name), handles in by_queue.items():
            vhost = self.vhosts.get(vhost_name)
            queue = vhost.queues.get(queue_name) if vhost is not None else None
            if queue is not None and not queue.deleted:
                queue.drop_unstored(handles)
        if self.on_commit_failed is not None:
            self.on_commit_failed(failure)

    def mark_vhost_unavailable(self, name, reason):
        """
        Vhost C{name} cannot be served: its store did not open. Connections to
        it are refused, saying C{reason}.
        """
        self.unavailable_vhosts[name] = reason

    def forget_vhost(self, name):
        """
        Stop serving vhost C{name} (being deleted); returns its L{VirtualHost}
        (or None) and its own store (or None), which the caller closes.
        """
        self.unavailable_vhosts.pop(name, None)
        delays = self._own_delays.pop(name, None)
        if delays is not None:
            delays.stop()
        return self.vhosts.pop(name, None), self.own_stores.pop(name, None)

    def stores(self):
        """Every store the broker uses: its own first, then the vhosts' own stores."""
        return [self.store, *self.own_stores.values()]

    def stop(self):
        """
        Cancel every timer (queue expiry, x-expires, delayed delivery): the
        broker is shutting down.
        """
        self.delays.stop()
        for delays in self._own_delays.values():
            delays.stop()
        for vhost in self.vhosts.values():
            for queue in vhost.queues.values():
                queue.stop_timers()

    def vhost(self, name, user=None):
        """
        The virtual host C{name}; raises NotAllowed (530), as AMQP's
        connection.open does, for an unknown vhost and for one whose store did
        not open (the text names the damage; C{user} is named in it if given).
        """
        name = name or DEFAULT_VHOST
        vhost = self.vhosts.get(name)
        if vhost is None:
            damage = self.unavailable_vhosts.get(name)
            if damage is not None:
                raise NotAllowed(vhost_down_text(name, user, damage))
            raise NotAllowed(f"vhost {name} not found")  # RabbitMQ's text, word for word
        return vhost

    def _recover_messages(self, queue):
        """Enqueue a durable queue's stored messages; a damaged queue is marked unavailable."""
        store = queue.vhost.store
        try:
            queue.recovery.restore_delivery_counts(store.delivery_counts(queue.key))
            if IPagingStore.providedBy(store):
                handles = store.recovered_handles(queue.key)
                queue.recovery.restore_paged(handles)
                return len(handles)
            recovered = [(Message.from_record(record), handle, redelivered)
                         for handle, record, redelivered in store.recover(queue.key)]
        except StoreCorrupted as damage:
            log.error(
                "queue {queue!r} in vhost {vhost!r} is unavailable: {damage}",
                queue=queue.name, vhost=queue.vhost.name, damage=damage,
            )
            queue.vhost.mark_unavailable(queue, str(damage))
            return 0
        for message, handle, redelivered in recovered:
            queue.recovery.restore(message, handle, redelivered)
        return len(recovered)

    def recover(self, store=None):
        """
        Rebuild durable topology and messages from the (opened) C{store} (the
        broker's own by default; a vhost's own store after L{add_vhost} gave it
        to that vhost), in queue order. Called once per store at start, before
        any listener accepts clients.

        A record the store cannot read back, or whose values the model cannot
        take, is quarantined: named in the log and left out, and everything
        else is recovered. A quarantined queue whose name is known comes back
        unavailable, holding its name and stored data until it is deleted.

        @return: a dict with the numbers of exchanges, queues, bindings and
            messages recovered, and of records quarantined.
        """
        counts = {
            "exchanges": 0, "queues": 0, "bindings": 0, "messages": 0, "unavailable": 0,
            "quarantined": 0,
        }
        store = self.store if store is None else store
        owner = next(
            (name for name, own_store in self.own_stores.items() if own_store is store), None
        )
        for record in store.topology():
            if isinstance(record, QuarantinedRecord):
                self._quarantine(record)
                counts["quarantined"] += 1
                continue
            if not isinstance(record, TOPOLOGY_RECORDS):
                raise TypeError(
                    f"store {store.name!r} returned an unknown topology record: {record!r}"
                )
            # A vhost's own store holds that vhost's records only.
            if owner is not None and record.vhost != owner:
                log.error(
                    "quarantined the {kind} {name!r} of vhost {other!r} found in the {backend}"
                    " store of vhost {vhost!r}: it is not served;"
                    " its record is kept on disk as it is",
                    kind=_kind(record), name=_name(record), other=record.vhost, backend=store.name,
                    vhost=owner,
                )
                counts["quarantined"] += 1
                continue
            try:
                self._restore(record, counts)
            # Values the model cannot take: that record alone is lost to service.
            except Exception as problem:
                self._quarantine(_unrestorable(record, problem, store.name))
                counts["quarantined"] += 1
        counts["unavailable"] = sum(len(vhost.unavailable_queues) for vhost in self.vhosts.values()
                                    if vhost.store is store)
        if IDelayedMessageStore.providedBy(store):
            (self.delays if owner is None else self._own_delays[owner]).start()
        log.info(
            "recovered {exchanges} exchanges, {queues} queues ({unavailable} unavailable),"
            " {bindings} bindings and {messages} messages from the {backend} store{whose};"
            " {quarantined} records quarantined",
            backend=store.name,
            whose="" if owner is None else f" of vhost {owner!r}",
            **counts,
        )
        return counts

    def _restore(self, record, counts):
        """
        Put one readable topology record back in its vhost (and a queue's
        messages in the queue).
        """
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
            queue = vhost.restore_queue(
                record.name, record.auto_delete, table_to_dict(record.arguments)
            )
            counts["messages"] += self._recover_messages(queue)
            counts["queues"] += 1
        else:
            arguments = table_to_dict(record.arguments)
            destination = record.destination_exchange
            restored = vhost.restore_binding(
                record.queue, record.exchange, record.routing_key, arguments, destination
            )
            if restored:
                counts["bindings"] += 1
            else:
                log.warn(
                    "store {backend!r} holds a binding from {exchange!r} to {destination}"
                    " in vhost {vhost!r} whose source or destination it does not hold; skipped",
                    backend=vhost.store.name,
                    exchange=record.exchange,
                    destination=(
                        f"exchange {destination!r}" if destination else f"queue {record.queue!r}"
                    ),
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
            what = (
                f"the binding of exchange {name[0]!r} to exchange {name[3]!r}"
                f" with routing key {name[2]!r}"
            )
        elif kind == "binding":
            what = (
                f"the binding of exchange {name[0]!r} to queue {name[1]!r}"
                f" with routing key {name[2]!r}"
            )
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
            consequence = (
                "it is unavailable (404) until deleted;"
                " its record and messages are kept on disk as they are"
            )
        elif kind == "queue":
            consequence = "it is not served; its record and messages are kept on disk as they are"
        else:
            consequence = "it is not served; its record is kept on disk as it is"
        log.error(
            "quarantined {what}: its stored record ({where}) cannot be used:"
            " {reason}; {consequence}",
            what=what, where=quarantined.where, reason=quarantined.reason, consequence=consequence,
        )


def vhost_down_text(name, user, damage):
    """
    The 530 text refusing a vhost whose store did not open: RabbitMQ's words
    for a vhost that is down (rabbit_reader), then the damage.
    """
    refused = f"access to vhost '{name}' refused for user '{user}': " if user is not None else ""
    return f"{refused}vhost '{name}' is down: {damage}"


def _kind(record):
    if isinstance(record, messages_pb2.BindingRecord):
        return "binding"
    return "exchange" if isinstance(record, messages_pb2.ExchangeRecord) else "queue"


def _name(record):
    if isinstance(record, messages_pb2.BindingRecord):
        name = (record.exchange, record.queue, record.routing_key)
        return name + (record.destination_exchange,) if record.destination_exchange else name
    return record.name


def _unrestorable(record, problem, backend):
    """The L{QuarantinedRecord} of a record that parsed but whose values the model refused."""
    reason = f"its values cannot be taken ({problem})"
    return QuarantinedRecord(
        _kind(record), record.vhost, _name(record), f"in the {backend} store", reason
    )
