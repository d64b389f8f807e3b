"""Virtual hosts: the namespace of exchanges, queues and bindings.

Every topology rule lives here: idempotent declares, refused redeclares with
other attributes, passive checks, reserved ``amq.`` names, if-unused / if-empty
deletes, exclusive ownership and auto-delete. Durable topology is written
through to the store. A binding's destination is a queue or, for
exchange-to-exchange bindings, another exchange; routing follows those from
exchange to exchange (see L{brokerd.model.routing}). The vhost's policies
(L{VirtualHost.set_policies}) apply to its queues and exchanges as they are
declared and whenever the policies change (see L{brokerd.model.policy_effects}).
"""

from brokerd.errors import (
    AccessRefused,
    CommandInvalid,
    NotFound,
    PreconditionFailed,
)
from brokerd.interfaces import IDelayedMessageStore
from brokerd.model.counters import QueueChurn
from brokerd.model.delayeddelivery import delay_of
from brokerd.model.held_dispatches import HeldDispatches
from brokerd.model.exchange import (
    DELAYED_TYPE,
    EXCHANGE_TYPES,
    KNOWN_TYPES,
    Binding,
    DefaultExchange,
    comparable_exchange_arguments,
    make_exchange,
)
from brokerd.model.firehose import TRACE_EXCHANGE
from brokerd.model.names import check_not_reserved, check_short_string, generate_queue_name
from brokerd.model.policy_effects import VhostPolicies, unapplied_keys
from brokerd.model.queue import Queue
from brokerd.model.queue_arguments import message_ttl_of
from brokerd.model.queue_types import check_declaration, comparable_arguments, locked_queue
from brokerd.model.routing import route_now
from brokerd.model.topology_records import (
    binding_record,
    check_equivalent,
    exchange_record,
    flags,
    queue_record,
)
from brokerd.model.watermark import MemoryWatermark
from brokerd.proto.tables import freeze

PREDECLARED_EXCHANGES = {
    "amq.direct": "direct",
    "amq.fanout": "fanout",
    "amq.topic": "topic",
    "amq.headers": "headers",
    "amq.match": "headers",
    TRACE_EXCHANGE: "topic",  # internal: only the firehose publishes to it
}
# RabbitMQ's text, word for word:
DEFAULT_EXCHANGE_REFUSAL = "operation not permitted on the default exchange"


class VirtualHost:
    """
    One virtual host.

    @ivar clock: the broker's C{IReactorTime}, which every timer of the
        vhost's queues runs on and which stamps publish times.
    @ivar exchanges: name -> exchange, the default exchange under C{""}.
    @ivar queues: name -> queue.
    @ivar policies: its L{brokerd.model.policy_effects.Policy} records, highest priority first.
    @ivar queue_limit: how many queues it may hold (its C{max-queues}), or None: no limit.
    """

    def __init__(self, name, store, clock, watermark=None):
        self.name = name
        self.store = store
        self.clock = clock
        self.watermark = watermark if watermark is not None else MemoryWatermark()
        self.exchanges = {"": DefaultExchange(self, "", durable=True)}
        self.queues = {}
        self.quorum_queues = 0  # how many: transient messages are stored only if some queue is one
        self.unavailable_queues = set()  # durable queues whose stored data is damaged
        self.delays = None  # the broker's DelayScheduler, for x-delayed-message exchanges
        self.queue_churn = QueueChurn()  # the broker gives every vhost its own, shared one
        self.queue_limit = None
        self.firehose = None  # while tracing is on, its Firehose (brokerd.model.firehose)
        self.dispatches = HeldDispatches()  # held while a connection's burst of frames is read
        self._policies = VhostPolicies(name)
        for exchange_name, type_name in PREDECLARED_EXCHANGES.items():
            self.exchanges[exchange_name] = EXCHANGE_TYPES[type_name](
                self, exchange_name, durable=True, internal=exchange_name == TRACE_EXCHANGE
            )

    def __repr__(self):
        return f"<VirtualHost {self.name!r}>"

    # -- policies

    @property
    def policies(self):
        return self._policies.policies

    def set_policies(self, policies):
        """
        Make C{policies} (L{brokerd.model.policy_effects.Policy} records; those of
        other vhosts are ignored) the vhost's, replacing the ones it had, and
        apply them to every queue and exchange now; the ones declared later
        get theirs when declared.
        """
        self._policies = VhostPolicies(self.name, policies)
        self._policies.apply_to_all(list(self.queues.values()), self.exchanges.values())

    def unapplied_policy_keys(self, policy):
        """The keys of C{policy}'s definition brokerd keeps but does not apply, sorted."""
        return unapplied_keys(policy)

    # -- lookups

    def exchange(self, name):
        """The exchange called C{name}; raises NotFound (404) if there is none."""
        exchange = self.exchanges.get(name)
        if exchange is None:
            check_short_string("exchange name", name)
            raise NotFound(f"no exchange {name!r} in vhost {self.name!r}")
        return exchange

    def queue(self, name, connection=None):
        """The queue called C{name}, checked for exclusive use by C{connection}."""
        queue = self.queues.get(name)
        if queue is None:
            check_short_string("queue name", name)
            raise NotFound(f"no queue {name!r} in vhost {self.name!r}")
        if connection is not None:
            queue.check_access(connection)
        return queue

    # -- exchanges

    def declare_exchange(
        self, name, type_name, passive=False, durable=False, auto_delete=False, internal=False,
        arguments=None,
    ):
        """Declare (or with C{passive}, check) an exchange; returns it."""
        check_short_string("exchange name", name)
        if name == "":
            raise AccessRefused(DEFAULT_EXCHANGE_REFUSAL)
        existing = self.exchanges.get(name)
        if passive:
            if existing is None:
                raise NotFound(f"no exchange {name!r} in vhost {self.name!r}")
            return existing
        if type_name not in KNOWN_TYPES:
            raise CommandInvalid(f"unknown exchange type '{type_name}'")  # RabbitMQ's text
        if type_name == DELAYED_TYPE and not IDelayedMessageStore.providedBy(self.store):
            raise PreconditionFailed(f"the {self.store.name} store cannot keep delayed messages")
        arguments = dict(arguments or {})
        if existing is not None:
            check_equivalent(
                self.name,
                "exchange",
                name,
                {"type": (type_name, existing.type_name)}
                | flags(
                    durable=(durable, existing.durable),
                    auto_delete=(auto_delete, existing.auto_delete),
                    internal=(internal, existing.internal),
                ),
                *comparable_exchange_arguments(arguments, existing.arguments),
            )
            return existing
        check_not_reserved("exchange", name)
        exchange = make_exchange(self, name, type_name, durable, auto_delete, internal, arguments)
        self.exchanges[name] = exchange
        self._policies.apply_to_new_exchange(exchange)
        if durable:
            self.store.save_exchange(exchange_record(self.name, exchange))
        return exchange

    def delete_exchange(self, name, if_unused=False):
        """Delete an exchange and its bindings; deleting a missing one is not an error."""
        check_short_string("exchange name", name)
        if name == "":
            raise AccessRefused(DEFAULT_EXCHANGE_REFUSAL)
        if name.startswith("amq."):  # as RabbitMQ, whether it exists or not
            raise AccessRefused(
                f"deletion of system exchange {name!r} in vhost {self.name!r} not allowed"
            )
        exchange = self.exchanges.get(name)
        if exchange is None:
            return
        if if_unused and exchange.bindings:  # as RabbitMQ, only bindings whose source it is count
            raise PreconditionFailed(f"exchange {name!r} in vhost {self.name!r} in use")
        self._delete_exchanges(exchange)

    def _delete_exchanges(self, exchange):
        """
        Delete C{exchange} with the bindings it is the source or destination
        of, then each auto-delete exchange that this leaves with no binding as
        a source, and so on (in a loop: a chain of them may be long).
        """
        pending = [exchange]
        while pending:
            exchange = pending.pop()
            if self.exchanges.get(exchange.name) is not exchange:
                continue
            del self.exchanges[exchange.name]
            for binding in list(exchange.bindings.values()):
                exchange.remove_binding(binding)
                _detach(binding)
            for binding in list(exchange.incoming):  # the store forgets these with the exchange
                source = binding.exchange
                source.remove_binding(binding)
                _detach(binding)
                if source.auto_delete and not source.bindings:
                    pending.append(source)
            if exchange.durable:
                self.store.delete_exchange(self.name, exchange.name)

    # -- queues

    def declare_queue(
        self, name, connection=None, passive=False, durable=False, exclusive=False,
        auto_delete=False, arguments=None, server_named=False,
    ):
        """Declare (or with C{passive}, check) a queue; returns it.

        An empty C{name} asks the broker to pick one; C{server_named} says
        C{name} is one the broker picked already (to check permissions on it). C{connection} (an
        L{brokerd.interfaces.IQueueOwner}) owns the queue when C{exclusive} is set.
        """
        check_short_string("queue name", name)
        if passive:
            return self.queue(name, connection)
        self.queue_churn.declared += 1
        arguments = dict(arguments or {})
        existing = self.queues.get(name) if name else None
        if existing is not None:
            existing.check_access(connection)
            if exclusive != existing.exclusive:
                # As RabbitMQ: exclusivity is a lock, so a mismatch is 405, not 406.
                raise locked_queue(name, self.name)
            check_equivalent(
                self.name,
                "queue",
                name,
                flags(
                    durable=(durable, existing.durable),
                    auto_delete=(auto_delete, existing.auto_delete),
                ),
                *comparable_arguments(arguments, existing.arguments),
            )
            existing.touch()
            return existing
        if name and not server_named:
            check_not_reserved("queue", name)
        else:
            name = generate_queue_name()
        if self.queue_limit is not None and len(self.queues) >= self.queue_limit:
            raise PreconditionFailed(  # RabbitMQ's words, which say vhost, not virtual host
                f"cannot declare queue '{name}': queue limit in vhost '{self.name}'"
                f" ({self.queue_limit}) is reached"
            )
        check_declaration(name, self.name, durable, exclusive, auto_delete, arguments)
        queue = Queue(
            self, name, durable, connection if exclusive else None, auto_delete, arguments
        )
        self.queues[name] = queue
        self.queue_churn.created += 1
        self._policies.apply_to_new_queue(queue)
        self.quorum_queues += queue.policy.quorum
        if exclusive and connection is not None:
            connection.own(queue)
        if queue.persisted:
            self.store.save_queue(
                queue_record(self.name, name, auto_delete, arguments)
            )
        return queue

    def delete_queue(self, name, connection=None, if_unused=False, if_empty=False):
        """Delete a queue with its bindings and messages; returns how many
        ready messages went. Deleting a missing queue is not an error."""
        check_short_string("queue name", name)
        queue = self.queues.get(name)
        if queue is None:
            return 0
        if connection is not None:
            queue.check_access(connection)
        queue.check_delete(if_unused, if_empty)
        del self.queues[name]
        self.queue_churn.deleted += 1
        self.quorum_queues -= queue.policy.quorum
        self.unavailable_queues.discard(queue)
        for binding in list(queue.bindings):
            self._remove_binding(binding, persist=False)
        if queue.owner is not None:
            queue.owner.disown(queue)
        count = queue.mark_deleted()
        if queue.persisted:
            self.store.delete_queue(queue.key)
        return count

    def purge_queue(self, name, connection=None):
        return self.queue(name, connection).purge()

    # -- bindings

    def bind(self, queue_name, exchange_name, routing_key, arguments=None, connection=None):
        check_short_string("routing key", routing_key)
        queue = self.queue(queue_name, connection)
        exchange = self._bindable_exchange(exchange_name)
        arguments = dict(arguments or {})
        exchange.check_binding_arguments(arguments)
        binding = Binding(exchange, queue, routing_key, arguments)
        if exchange.add_binding(binding):
            queue.bindings.add(binding)
            if binding.durable:
                self.store.save_binding(binding_record(self.name, binding))

    def unbind(self, queue_name, exchange_name, routing_key, arguments=None, connection=None):
        """
        Remove a binding. As in RabbitMQ 3.10, unbinding is idempotent: a missing
        queue, exchange or binding is not an error (aio-pika's RPC unbinds its
        reply queue after that auto-delete queue went), and another connection's
        exclusive queue is refused (405) only when the binding exists; the
        default exchange is always refused (403).
        """
        check_short_string("routing key", routing_key)
        check_short_string("queue name", queue_name)
        check_short_string("exchange name", exchange_name)
        if exchange_name == "":
            raise AccessRefused(DEFAULT_EXCHANGE_REFUSAL)
        queue, exchange = self.queues.get(queue_name), self.exchanges.get(exchange_name)
        if queue is None or exchange is None:
            return
        existing = exchange.bindings.get((queue, routing_key, freeze(dict(arguments or {}))))
        if existing is None:
            return
        if connection is not None:
            queue.check_access(connection)
        self._remove_binding(existing, persist=True)

    def bind_exchange(self, destination_name, source_name, routing_key, arguments=None):
        """
        exchange.bind: what C{source_name} routes under the binding goes on to
        C{destination_name}, which routes it by its own type and bindings.
        Binding again what is bound is not an error; either end being the
        default exchange is 403, a missing one 404 (the source checked first).
        """
        check_short_string("routing key", routing_key)
        self._check_not_default(destination_name, source_name)
        source = self.exchange(source_name)
        destination = self.exchange(destination_name)
        arguments = dict(arguments or {})
        source.check_binding_arguments(arguments)
        binding = Binding(source, destination, routing_key, arguments)
        if source.add_binding(binding):
            destination.incoming.add(binding)
            if binding.durable:
                self.store.save_binding(binding_record(self.name, binding))

    def unbind_exchange(self, destination_name, source_name, routing_key, arguments=None):
        """exchange.unbind; as RabbitMQ 3.10, a missing source, destination or
        binding is not an error (only the default exchange at either end is)."""
        check_short_string("routing key", routing_key)
        self._check_not_default(destination_name, source_name)
        check_short_string("exchange name", source_name)
        check_short_string("exchange name", destination_name)
        source = self.exchanges.get(source_name)
        destination = self.exchanges.get(destination_name)
        if source is None or destination is None:
            return
        existing = source.bindings.get((destination, routing_key, freeze(dict(arguments or {}))))
        if existing is not None:
            self._remove_binding(existing, persist=True)

    def _check_not_default(self, *names):
        if "" in names:
            raise AccessRefused(DEFAULT_EXCHANGE_REFUSAL)

    def _bindable_exchange(self, name):
        if name == "":
            raise AccessRefused(DEFAULT_EXCHANGE_REFUSAL)
        return self.exchange(name)

    def _remove_binding(self, binding, persist):
        exchange = binding.exchange
        exchange.remove_binding(binding)
        _detach(binding)
        if persist and binding.durable:
            self.store.delete_binding(binding_record(self.name, binding))
        if exchange.auto_delete and not exchange.bindings:
            self._delete_exchanges(exchange)

    # -- publishing

    def publish(self, exchange_name, message):
        """
        Route a message and enqueue it on every matching queue, persisting it
        first if it is persistent and the store keeps some of those queues. It
        goes on through exchange-to-exchange bindings, and an exchange that
        routes it nowhere hands it to its alternate exchange, if it has one
        (see L{brokerd.model.routing}; no exchange is visited twice). A
        message with an x-delay header is kept until due by the delayed
        exchange it is published to, or reaches through a binding.

        @return: C{(queues it went to, whether the store holds it, whether a
            full queue refused it)}; a refusal means a nack for a confirming
            publisher.
        """
        exchange = self.exchanges.get(exchange_name)
        if exchange is None:
            self.exchange(exchange_name)  # raises NotFound with the right text
        if exchange.internal:
            raise AccessRefused(
                f"cannot publish to internal exchange {exchange_name!r} in vhost {self.name!r}"
            )
        # A malformed expiration is refused before anything is kept.
        message_ttl_of(message.properties)
        if exchange.delayed:
            milliseconds = delay_of(message)
            if milliseconds is not None:
                self.delays.delay(self, exchange, message, milliseconds)
                return 1, True, False  # kept by the store: confirmed once synced; routed when due
        return route_now(self, exchange, message)

    def route_now(self, exchange, message, accepts=None):
        """
        L{publish} without the delay at C{exchange}: route, store if
        persistent, enqueue (in the queues C{accepts} allows, if given); see
        L{brokerd.model.routing.route_now}.
        """
        return route_now(self, exchange, message, accepts)

    # -- recovery: rebuild durable topology without writing it back

    def mark_unavailable(self, queue, reason):
        """The store cannot give C{queue}'s messages back: refuse consumers and route nothing to it
        until it is deleted (which also drops its damaged data)."""
        queue.unavailable = reason
        self.unavailable_queues.add(queue)

    def restore_exchange(self, name, type_name, auto_delete, internal, arguments):
        exchange = make_exchange(self, name, type_name, True, auto_delete, internal, arguments)
        self.exchanges[name] = exchange
        self._policies.apply_to_new_exchange(exchange)
        return exchange

    def restore_queue(self, name, auto_delete, arguments):
        queue = Queue(self, name, durable=True, auto_delete=auto_delete, arguments=arguments)
        self.queues[name] = queue
        self.queue_churn.created += 1
        self._policies.apply_to_new_queue(queue)
        self.quorum_queues += queue.policy.quorum
        return queue

    def restore_binding(
        self, queue_name, exchange_name, routing_key, arguments, destination_exchange=""
    ):
        """Re-adds a stored binding (to the exchange C{destination_exchange} if
        it names one, else to the queue); returns False if either end is missing."""
        if destination_exchange:
            destination = self.exchanges.get(destination_exchange)
        else:
            destination = self.queues.get(queue_name)
        exchange = self.exchanges.get(exchange_name)
        if destination is None or exchange is None:
            return False
        binding = Binding(exchange, destination, routing_key, arguments)
        if exchange.add_binding(binding):
            _incoming(binding).add(binding)
        return True


def _incoming(binding):
    """The set of bindings to C{binding}'s destination (a queue's or an exchange's)."""
    destination = binding.destination
    return destination.incoming if binding.to_exchange else destination.bindings


def _detach(binding):
    _incoming(binding).discard(binding)
