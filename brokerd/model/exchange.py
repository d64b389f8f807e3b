"""Exchanges and their routing: direct, fanout, topic, headers and the default.

An exchange keeps its bindings and answers C{route(message)} with the queues a
message goes to (and, through C{forwards}, the exchanges it goes on to: see
L{brokerd.model.routing.route_onwards}). Each type keeps an index shaped for
its own lookups, so routing costs the same however many bindings unrelated
keys have.
"""

from brokerd.errors import CommandInvalid, PreconditionFailed
from brokerd.model.queue_arguments import amqp_type_name, erlang_term
from brokerd.model.topic import TopicTrie
from brokerd.proto.tables import freeze


class Binding:
    """
    A binding from a source exchange to a destination under a key, with arguments.

    The destination is a queue, or (an exchange-to-exchange binding, made by
    ``exchange.bind``) another exchange, which then routes what the source
    gives it by its own type and bindings.
    """

    __slots__ = ("exchange", "destination", "routing_key", "arguments", "identity", "to_exchange")

    def __init__(self, exchange, destination, routing_key, arguments):
        self.exchange = exchange
        self.destination = destination
        self.routing_key = routing_key
        self.arguments = arguments
        self.identity = (destination, routing_key, freeze(arguments))
        self.to_exchange = isinstance(destination, Exchange)

    @property
    def queue(self):
        """The destination queue, or None for a binding to an exchange."""
        return None if self.to_exchange else self.destination

    @property
    def durable(self):
        """Kept by the store: both ends are durable (a queue: kept by the store)."""
        destination = self.destination
        return self.exchange.durable and (
            destination.durable if self.to_exchange else destination.persisted
        )

    def __repr__(self):
        kind = "exchange" if self.to_exchange else "queue"
        return (
            f"<Binding {self.exchange.name!r} -> {kind} {self.destination.name!r}"
            f" key={self.routing_key!r}>"
        )


class Exchange:
    """
    Behaviour common to every exchange type; subclasses keep the routing index.

    @cvar type_name: the AMQP type string, e.g. C{"direct"}.
    @ivar alternate_exchange: the name of the exchange a message this one
        routes nowhere goes on to: its own C{alternate-exchange} argument, else
        its policy's (see L{brokerd.model.policy_effects}), else None.
    @ivar applied_policy: the vhost's L{brokerd.model.policy_effects.Policy} that
        applies to it, or None.
    """

    type_name = None
    delayed = False  # an x-delayed-message exchange holds messages with x-delay until they are due

    def __init__(
        self, vhost, name, durable=False, auto_delete=False, internal=False, arguments=None
    ):
        self.vhost = vhost
        self.name = name
        self.durable = durable
        self.auto_delete = auto_delete
        self.internal = internal
        self.arguments = dict(arguments or {})
        alternate = self.arguments.get("alternate-exchange")
        self.alternate_exchange = alternate if isinstance(alternate, str) else None
        self.applied_policy = None
        self.bindings = {}  # identity -> Binding, for every binding whose source this exchange is
        self.incoming = set()  # the bindings whose destination this exchange is
        # An index of this type over the bindings to exchanges, while there are any:
        self.forwards = None
        self._forward_count = 0

    def __repr__(self):
        return f"<{type(self).__name__} {self.name!r} in vhost {self.vhost.name!r}>"

    @classmethod
    def check_binding_arguments(cls, arguments):
        """Raises PreconditionFailed if a binding's arguments make no sense for this type."""

    def add_binding(self, binding):
        """Adds a binding; returns False if an identical one exists."""
        if binding.identity in self.bindings:
            return False
        self.bindings[binding.identity] = binding
        if binding.to_exchange:
            if self.forwards is None:
                self.forwards = type(self)(self.vhost, self.name)
            self.forwards._index(binding)
            self._forward_count += 1
        else:
            self._index(binding)
        return True

    def remove_binding(self, binding):
        """Removes a binding equal to C{binding}; returns the removed one or None."""
        existing = self.bindings.pop(binding.identity, None)
        if existing is None:
            return None
        if existing.to_exchange:
            self._forward_count -= 1
            if self._forward_count:
                self.forwards._unindex(existing)
            else:
                self.forwards = None
        else:
            self._unindex(existing)
        return existing

    def route(self, message):
        """The queues C{message} goes to (an iterable without repeats); C{forwards.route}
        gives the exchanges it goes on to."""
        raise NotImplementedError

    def _index(self, binding):
        raise NotImplementedError

    def _unindex(self, binding):
        raise NotImplementedError


class _CountingIndex:
    """Destinations per key, counting bindings so one unbind keeps the others."""

    __slots__ = ("by_key",)

    def __init__(self):
        self.by_key = {}

    def add(self, key, queue):
        queues = self.by_key.setdefault(key, {})
        queues[queue] = queues.get(queue, 0) + 1

    def remove(self, key, queue):
        queues = self.by_key.get(key)
        if not queues:
            return
        count = queues.get(queue, 0)
        if count <= 1:
            queues.pop(queue, None)
            if not queues:
                del self.by_key[key]
        else:
            queues[queue] = count - 1


class DirectExchange(Exchange):
    """Routes to queues bound with exactly the message's routing key."""

    type_name = "direct"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._queues = _CountingIndex()

    def route(self, message):
        return self._queues.by_key.get(message.routing_key, ())

    def _index(self, binding):
        self._queues.add(binding.routing_key, binding.destination)

    def _unindex(self, binding):
        self._queues.remove(binding.routing_key, binding.destination)


class FanoutExchange(Exchange):
    """Routes to every bound queue, whatever the routing key."""

    type_name = "fanout"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._queues = _CountingIndex()

    def route(self, message):
        return self._queues.by_key.get(None, ())

    def _index(self, binding):
        self._queues.add(None, binding.destination)

    def _unindex(self, binding):
        self._queues.remove(None, binding.destination)


class TopicExchange(Exchange):
    """Routes by pattern: ``*`` is one word, ``#`` zero or more (see L{TopicTrie})."""

    type_name = "topic"
    ROUTE_CACHE_SIZE = 4096

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._trie = TopicTrie()
        self._cache = {}  # routing key -> matched queues; cleared on any binding change

    def route(self, message):
        key = message.routing_key
        queues = self._cache.get(key)
        if queues is None:
            if len(self._cache) >= self.ROUTE_CACHE_SIZE:
                self._cache.clear()
            queues = self._cache[key] = self._trie.match(key)
        return queues

    def _index(self, binding):
        self._cache.clear()
        self._trie.add(binding.routing_key, binding.destination)

    def _unindex(self, binding):
        self._cache.clear()
        self._trie.remove(binding.routing_key, binding.destination)


class HeadersExchange(Exchange):
    """
    Routes on message headers against binding arguments.

    ``x-match`` is ``all`` (the default: every argument must match), ``any`` (at
    least one), or ``all-with-x`` / ``any-with-x`` which also compare arguments
    starting with ``x-``. An argument whose value is void matches any header of
    that name.
    """

    type_name = "headers"
    MATCH_MODES = ("all", "any", "all-with-x", "any-with-x")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # binding identity -> (queue, match_all, ((name, frozen value or None), ...))
        self._matchers = {}

    @classmethod
    def check_binding_arguments(cls, arguments):
        """
        As RabbitMQ's headers exchange, in its words: x-match must be a string
        naming one of L{MATCH_MODES}.
        """
        mode = arguments.get("x-match", "all")
        if not isinstance(mode, str):
            raise PreconditionFailed(
                f"Invalid x-match field type {amqp_type_name(mode)}"
                f" (value {erlang_term(mode)}); expected longstr"
            )
        if mode not in cls.MATCH_MODES:
            raise PreconditionFailed(
                f"Invalid x-match field value {erlang_term(mode)};"
                " expected all, any, all-with-x, or any-with-x"
            )

    def route(self, message):
        if not self._matchers:
            return ()
        headers = message.headers
        queues = set()
        for queue, match_all, required in self._matchers.values():
            if queue in queues:
                continue
            if _headers_match(headers, match_all, required):
                queues.add(queue)
        return queues

    def _index(self, binding):
        arguments = binding.arguments
        mode = arguments.get("x-match", "all")
        with_x = mode.endswith("-with-x")
        required = tuple(
            (name, None if value is None else freeze(value))
            for name, value in arguments.items()
            if name != "x-match" and (with_x or not name.startswith("x-"))
        )
        self._matchers[binding.identity] = (binding.destination, mode.startswith("all"), required)

    def _unindex(self, binding):
        self._matchers.pop(binding.identity, None)


_ABSENT = object()


def _headers_match(headers, match_all, required):
    if match_all:
        for name, expected in required:
            value = headers.get(name, _ABSENT)
            if value is _ABSENT or (expected is not None and freeze(value) != expected):
                return False
        return True
    for name, expected in required:
        value = headers.get(name, _ABSENT)
        if value is not _ABSENT and (expected is None or freeze(value) == expected):
            return True
    return False


class DefaultExchange(Exchange):
    """The nameless exchange: routes to the queue named by the routing key.

    Every queue is implicitly bound to it; it takes no explicit bindings.
    """

    type_name = "direct"

    def route(self, message):
        queue = self.vhost.queues.get(message.routing_key)
        return (queue,) if queue is not None else ()


# As RabbitMQ's rabbit_exchange:assert_args_equivalence:
COMPARED_EXCHANGE_ARGUMENTS = frozenset({"alternate-exchange"})


def comparable_exchange_arguments(received, current):
    """
    The parts of an exchange redeclaration's C{received} arguments and the
    exchange's C{current} ones that must be equal: as in RabbitMQ, only
    C{alternate-exchange} (for every type, x-delayed-message included); the
    others may differ, and the exchange keeps the ones it was declared with.
    """
    return (
        {name: value for name, value in received.items() if name in COMPARED_EXCHANGE_ARGUMENTS},
        {name: value for name, value in current.items() if name in COMPARED_EXCHANGE_ARGUMENTS},
    )


EXCHANGE_TYPES = {
    cls.type_name: cls for cls in (DirectExchange, FanoutExchange, TopicExchange, HeadersExchange)
}

DELAYED_TYPE = "x-delayed-message"
KNOWN_TYPES = (*EXCHANGE_TYPES, DELAYED_TYPE)


def make_exchange(
    vhost, name, type_name, durable=False, auto_delete=False, internal=False, arguments=None
):
    """
    A new exchange of C{type_name}. An C{x-delayed-message} exchange routes
    as the type its C{x-delayed-type} argument names, once a message is due.

    @raise CommandInvalid: for an unknown type (503, as RabbitMQ).
    @raise PreconditionFailed: for a delayed exchange without a valid x-delayed-type.
    """
    if type_name == DELAYED_TYPE:
        inner = (arguments or {}).get("x-delayed-type")
        cls = EXCHANGE_TYPES.get(inner) if isinstance(inner, str) else None
        if cls is None:
            raise PreconditionFailed(
                f"invalid arg 'x-delayed-type' for exchange {name!r} in vhost {vhost.name!r}:"
                f" {inner!r} is none of {', '.join(EXCHANGE_TYPES)}"
            )
        exchange = cls(vhost, name, durable, auto_delete, internal, arguments)
        exchange.type_name = DELAYED_TYPE
        exchange.delayed = True
        return exchange
    cls = EXCHANGE_TYPES.get(type_name)
    if cls is None:
        raise CommandInvalid(f"unknown exchange type '{type_name}'")  # RabbitMQ's text
    return cls(vhost, name, durable, auto_delete, internal, arguments)
