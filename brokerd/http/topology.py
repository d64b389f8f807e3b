"""C{/api/queues}, C{/api/exchanges} and C{/api/bindings}: listing and changing a vhost's topology.

Listings read the model directly (only the vhosts the user sees); changes go
through a L{brokerd.http.operations.management_channel}, so permissions and
equivalence checks are those of AMQP. Shapes and field names are RabbitMQ's.
"""

import weakref
import zlib
from urllib.parse import quote, quote_plus, unquote

from brokerd.http.operations import management_channel
from brokerd.http.overview import unacked_by_queue
from brokerd.http.rates import CounterRates
from brokerd.http.routes import (
    Created,
    RawJson,
    bad_request,
    encode_text,
    json_body,
    not_found,
    parse_bool,
    query_value,
)

DEFAULT_EXCHANGE = ""


def _vhosts(api, vhost=None):
    """The model vhosts to list: C{vhost} alone (checked), or every visible one."""
    broker = api.context.broker
    if vhost is not None:
        return [api.model_vhost(vhost)]
    return [broker.vhosts[name] for name in api.visible_vhosts() if name in broker.vhosts]


def _arguments(body):
    arguments = body.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise bad_request("arguments must be a JSON object")
    return arguments


# -- queues

def fixed_queue_info(api, queue):
    """What does not change in a queue's lifetime (declared fields, then the same every time)."""
    return {
        "name": queue.name,
        "vhost": queue.vhost.name,
        "durable": queue.durable,
        "auto_delete": queue.auto_delete,
        "exclusive": queue.exclusive,
        "arguments": queue.arguments,
        "type": "quorum" if queue.policy.quorum else "classic",
        "node": api.context.node,
        "exclusive_consumer_tag": None,
        "operator_policy": None,  # brokerd has no operator policies
        "recoverable_slaves": None,  # nor mirrors
    }


def policy_name(queue_or_exchange):
    """The name of the policy applied to it (RabbitMQ's C{policy} field), or None."""
    policy = queue_or_exchange.applied_policy
    return policy.name if policy is not None else None


def effective_policy(queue):
    """
    The definition of the policy applied to C{queue} ({} for none), RabbitMQ's
    C{effective_policy_definition}.
    """
    policy = queue.applied_policy
    return policy.definition if policy is not None else {}


LISTED_TEMPLATE = (
    '{%s,"policy":%s,"effective_policy_definition":%s,"state":"%s","messages":%d,'
    '"messages_ready":%d,'
    '"messages_unacknowledged":%d,"consumers":%d,"memory":%d,'
    '"message_stats":{"publish":%d,"publish_details":{"rate":%.1f},"deliver_get":%d,'
    '"deliver_get_details":{"rate":%.1f},"ack":%d,"ack_details":{"rate":%.1f}}}'
)


class QueueListing:
    """
    What the API keeps per queue between looks, so that a listing of
    thousands of queues stays quick: the JSON text of its fixed fields, its
    counters' L{CounterRates}, and its last listed line with the figures it
    was made from (an idle queue's line is reused as it is).
    """

    __slots__ = ("queue", "fixed", "rates", "figures", "line")

    def __init__(self, queue, now):
        self.queue = weakref.ref(queue)
        self.fixed = None
        self.rates = CounterRates(now, _counters(queue))
        self.figures = self.line = None


def _counters(queue):
    return queue.messages_published, queue.messages_delivered, queue.messages_acked


class QueueListings:
    """
    The L{QueueListing} of each queue looked at, by queue identity; entries of
    deleted queues are dropped.
    """

    def __init__(self):
        self._entries = {}
        self._prune_above = 1000

    def entry(self, queue, now):
        found = self._entries.get(id(queue))
        if found is None or found.queue() is not queue:
            if len(self._entries) >= self._prune_above:
                self._drop_gone()
            found = self._entries[id(queue)] = QueueListing(queue, now)
        return found

    def _drop_gone(self):
        """Forget deleted queues; the next pruning waits until the entries have doubled."""
        self._entries = {
            key: entry for key, entry in self._entries.items() if entry.queue() is not None
        }
        self._prune_above = max(1000, 2 * len(self._entries))


_listings = QueueListings()


def _stats(entry, queue, now):
    """C{(publish, rate, deliver_get, rate, ack, rate)} of C{queue}, rates rounded as shown."""
    counts = _counters(queue)
    rates = entry.rates.rates(now, counts)
    return (
        counts[0], round(rates[0], 1), counts[1], round(rates[1], 1), counts[2],
        round(rates[2], 1),
    )


def message_stats(queue, now):
    entry = _listings.entry(queue, now)
    publish, publish_rate, deliver, deliver_rate, ack, ack_rate = _stats(entry, queue, now)
    return {
        "publish": publish, "publish_details": {"rate": publish_rate},
        "deliver_get": deliver, "deliver_get_details": {"rate": deliver_rate},
        "ack": ack, "ack_details": {"rate": ack_rate},
    }


def queue_info(api, queue, unacked):
    ready = queue.message_count
    pending = unacked.get(queue.key, 0)
    return {
        **fixed_queue_info(api, queue),
        "policy": policy_name(queue),
        "effective_policy_definition": effective_policy(queue),
        "state": "running" if queue.unavailable is None else "down",
        "messages": ready + pending,
        "messages_ready": ready,
        "messages_unacknowledged": pending,
        "consumers": queue.consumer_count,
        "memory": queue.ready_bytes,
        "message_stats": message_stats(queue, api.context.broker.clock.seconds()),
    }


def list_queues(api, vhost=None):
    """
    Every visible queue as L{queue_info} gives it, built from cached parts
    (quick for thousands of queues).
    """
    unacked = unacked_by_queue(api.context.broker)
    now = api.context.broker.clock.seconds()
    entry_of = _listings.entry
    parts = []
    for model in _vhosts(api, vhost):
        queues = model.queues
        for name in sorted(queues):
            queue = queues[name]
            entry = entry_of(queue, now)
            ready = queue.message_count
            pending = unacked.get(queue.key, 0)
            counts = _counters(queue)
            rates = entry.rates.rates(now, counts)
            figures = (
                queue.applied_policy, "running" if queue.unavailable is None else "down",
                ready + pending, ready, pending, queue.consumer_count, queue.ready_bytes, counts,
                rates,
            )
            if figures != entry.figures:
                if entry.fixed is None:
                    entry.fixed = encode_text(fixed_queue_info(api, queue))[1:-1]
                entry.figures = figures
                entry.line = LISTED_TEMPLATE % (
                    entry.fixed, encode_text(policy_name(queue)),
                    encode_text(effective_policy(queue)), *figures[1:7], counts[0],
                    rates[0], counts[1], rates[1], counts[2], rates[2],
                )
            parts.append(entry.line)
    return RawJson("[" + ",".join(parts) + "]")


def _queue(api, vhost, name):
    queue = api.model_vhost(vhost).queues.get(name)
    if queue is None:
        raise not_found()
    return queue


def get_queue(api, vhost, name):
    return queue_info(api, _queue(api, vhost, name), unacked_by_queue(api.context.broker))


def put_queue(api, vhost, name):
    body = json_body(api.request)
    model = api.model_vhost(vhost)
    created = name not in model.queues
    with management_channel(api, vhost) as channel:
        channel.queue_declare(
            name, durable=parse_bool(body.get("durable"), True),
            auto_delete=parse_bool(body.get("auto_delete")), arguments=_arguments(body),
        )
    return Created() if created else None


def delete_queue(api, vhost, name):
    _queue(api, vhost, name)
    if_empty = parse_bool(query_value(api.request, "if-empty"))
    if_unused = parse_bool(query_value(api.request, "if-unused"))
    with management_channel(api, vhost) as channel:
        channel.queue_delete(name, if_unused=if_unused, if_empty=if_empty)


def purge_queue(api, vhost, name):
    _queue(api, vhost, name)
    with management_channel(api, vhost) as channel:
        channel.queue_purge(name)


# -- exchanges

def exchange_info(exchange):
    """An exchange as RabbitMQ lists it: C{policy} only when one applies (a queue has null)."""
    info = {
        "name": exchange.name,
        "vhost": exchange.vhost.name,
        "type": exchange.type_name,
        "durable": exchange.durable,
        "auto_delete": exchange.auto_delete,
        "internal": exchange.internal,
        "arguments": exchange.arguments,
        "user_who_performed_action": "",
    }
    if exchange.applied_policy is not None:
        info["policy"] = exchange.applied_policy.name
    return info


def list_exchanges(api, vhost=None):
    return [exchange_info(exchange) for model in _vhosts(api, vhost)
            for exchange in sorted(model.exchanges.values(), key=lambda exchange: exchange.name)]


def _exchange(api, vhost, name):
    exchange = api.model_vhost(vhost).exchanges.get(name)
    if exchange is None:
        raise not_found()
    return exchange


def get_exchange(api, vhost, name):
    return exchange_info(_exchange(api, vhost, name))


def put_exchange(api, vhost, name):
    body = json_body(api.request)
    type_name = body.get("type")
    if not isinstance(type_name, str):
        raise bad_request("[{key_missing,type}]")  # RabbitMQ's with_decode complaint
    created = name not in api.model_vhost(vhost).exchanges
    with management_channel(api, vhost) as channel:
        channel.exchange_declare(
            name, type_name, durable=parse_bool(body.get("durable"), True),
            auto_delete=parse_bool(body.get("auto_delete")),
            internal=parse_bool(body.get("internal")), arguments=_arguments(body),
        )
    return Created() if created else None


def delete_exchange(api, vhost, name):
    _exchange(api, vhost, name)
    if_unused = parse_bool(query_value(api.request, "if-unused"))
    with management_channel(api, vhost) as channel:
        channel.exchange_delete(name, if_unused=if_unused)


# -- bindings

def properties_key(routing_key, arguments):
    """
    RabbitMQ's C{properties_key} of a binding (C{rabbit_mgmt_format:pack_binding_props}): "~" for
    none, else the routing key quoted as a form value with its "%" quoted again, then "~" and a
    hash of the arguments if it has any.
    """
    if not routing_key and not arguments:
        return "~"
    key = _quote_binding(routing_key)
    if not arguments:
        return key
    return f"{key}~{zlib.crc32(repr(sorted(arguments.items())).encode()):x}"


def _quote_binding(text):
    return quote_plus(text, safe="-_.~").replace("%", "%25")


def binding_info(vhost_name, source, destination, destination_type, routing_key, arguments):
    return {
        "source": source, "vhost": vhost_name, "destination": destination,
        "destination_type": destination_type, "routing_key": routing_key, "arguments": arguments,
        "properties_key": properties_key(routing_key, arguments),
    }


def _bindings(model):
    """
    Every binding of a vhost as RabbitMQ lists them: the default exchange's
    implicit ones first.
    """
    found = [
        binding_info(model.name, DEFAULT_EXCHANGE, name, "queue", name, {})
        for name in sorted(model.queues)
    ]
    for exchange in sorted(model.exchanges.values(), key=lambda exchange: exchange.name):
        for binding in exchange.bindings.values():
            kind = "exchange" if binding.to_exchange else "queue"
            found.append(binding_info(
                model.name, exchange.name, binding.destination.name, kind, binding.routing_key,
                dict(binding.arguments or {}),
            ))
    return found


def list_bindings(api, vhost=None):
    return [binding for model in _vhosts(api, vhost) for binding in _bindings(model)]


def _between(api, vhost, source, kind, destination):
    model = api.model_vhost(vhost)
    destinations = model.exchanges if kind == "exchange" else model.queues
    if source not in model.exchanges or destination not in destinations:
        raise not_found()
    return [binding for binding in _bindings(model) if binding["source"] == source
            and binding["destination"] == destination and binding["destination_type"] == kind]


def bindings_to_queue(api, vhost, source, destination):
    return _between(api, vhost, source, "queue", destination)


def bindings_to_exchange(api, vhost, source, destination):
    return _between(api, vhost, source, "exchange", destination)


def _bind(api, vhost, source, kind, destination, prefix):
    """Bind as RabbitMQ does: a missing end is the channel's 404, C{amq.default} is C{""}."""
    api.model_vhost(vhost)
    body = json_body(api.request)
    routing_key = body.get("routing_key", "")
    if not isinstance(routing_key, str):
        raise bad_request("routing_key must be a string")
    arguments = _arguments(body)
    exchange = DEFAULT_EXCHANGE if source == "amq.default" else source
    with management_channel(api, vhost) as channel:
        if kind == "queue":
            channel.queue_bind(destination, exchange, routing_key, arguments)
        else:
            channel.exchange_bind(destination, exchange, routing_key, arguments)
    path = "/".join(quote(part, safe="") for part in (vhost, "e", source, prefix, destination))
    return Created(f"/api/bindings/{path}/{properties_key(routing_key, arguments)}")


def bind_queue(api, vhost, source, destination):
    return _bind(api, vhost, source, "queue", destination, "q")


def bind_exchange(api, vhost, source, destination):
    return _bind(api, vhost, source, "exchange", destination, "e")


def _binding(api, vhost, source, kind, destination, props):
    for binding in _between(api, vhost, source, kind, destination):
        # The key as it is (its segment quoted once more, as clients do) or as
        # it comes in the Location header.
        if props in (binding["properties_key"], unquote(binding["properties_key"])):
            return binding
    raise not_found()


def get_queue_binding(api, vhost, source, destination, props):
    return _binding(api, vhost, source, "queue", destination, props)


def get_exchange_binding(api, vhost, source, destination, props):
    return _binding(api, vhost, source, "exchange", destination, props)


def unbind_queue(api, vhost, source, destination, props):
    binding = _binding(api, vhost, source, "queue", destination, props)
    with management_channel(api, vhost) as channel:
        channel.queue_unbind(destination, source, binding["routing_key"], binding["arguments"])


def unbind_exchange(api, vhost, source, destination, props):
    binding = _binding(api, vhost, source, "exchange", destination, props)
    with management_channel(api, vhost) as channel:
        channel.exchange_unbind(destination, source, binding["routing_key"], binding["arguments"])


def queue_bindings(api, vhost, name):
    """C{/api/queues/VHOST/NAME/bindings}: the bindings to a queue, the default exchange's first."""
    _queue(api, vhost, name)
    return [binding for binding in _bindings(api.model_vhost(vhost))
            if binding["destination_type"] == "queue" and binding["destination"] == name]


def exchange_bindings_from(api, vhost, name):
    """C{/api/exchanges/VHOST/NAME/bindings/source}: the bindings whose source is the exchange."""
    _exchange(api, vhost, name)
    return [binding for binding in _bindings(api.model_vhost(vhost)) if binding["source"] == name]


def exchange_bindings_to(api, vhost, name):
    """C{/api/exchanges/VHOST/NAME/bindings/destination}: the bindings to the exchange."""
    _exchange(api, vhost, name)
    return [binding for binding in _bindings(api.model_vhost(vhost))
            if binding["destination_type"] == "exchange" and binding["destination"] == name]
