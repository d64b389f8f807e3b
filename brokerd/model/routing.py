"""Where a published message goes in its vhost: through its exchanges to
queues, into the store, into each queue.

The vhost (L{brokerd.model.vhost.VirtualHost}) keeps the topology; this is
the path a message takes through it once published: the exchange's own
queues, then onwards through exchange-to-exchange bindings and alternate
exchanges (L{route_onwards}), the queues that are available and not full,
the store for a message that must be kept (one append for every queue that
keeps it), and each queue's enqueue.
"""

from brokerd.errors import PreconditionFailed
from brokerd.model.delayeddelivery import delay_of


def route_now(vhost, exchange, message, accepts=None):
    """
    Route C{message}, published to C{exchange} of C{vhost}, and enqueue it on
    every queue it reaches (those C{accepts} allows, if given), storing it
    first if it is persistent and the store keeps some of those queues. A
    delayed exchange reached through a binding keeps the message until due
    (see L{route_onwards}); that counts as routed and kept by the store.

    @return: C{(queues it went to, whether the store holds it, whether a
        full queue refused it)}.
    """
    queues = exchange.route(message)
    delaying = ()
    if exchange.forwards is not None or (not queues and exchange.alternate_exchange is not None):
        queues, delaying = route_onwards(exchange, message, queues, vhost.exchanges)
        if delaying:
            milliseconds = delay_of(message)
            for delayed in delaying:
                vhost.delays.delay(vhost, delayed, message, milliseconds)
    if accepts is not None:
        queues = [queue for queue in queues if accepts(queue)]
    if vhost.unavailable_queues:
        queues = [queue for queue in queues if queue.unavailable is None]
    refused = False
    if queues:
        full = [queue for queue in queues if queue.refuses(message)]
        if full:
            refused = True
            queues = [queue for queue in queues if queue not in full]
            for queue in full:
                queue.refused(message)
    if not queues:
        if delaying:
            return len(delaying), True, refused
        return 0, False, refused
    if message.published_at is None and (
        message.properties.HasField("expiration")
        or any(queue.policy.message_ttl is not None for queue in queues)
    ):
        # Kept with it: its TTL counts from now.
        message.published_at = int(vhost.clock.seconds() * 1000)
    handle = None
    persistent = message.persistent
    # A quorum queue keeps every message, transient ones too, as RabbitMQ's do.
    if persistent:
        keeping = [queue for queue in queues if queue.persisted]
    elif vhost.quorum_queues:
        keeping = [queue for queue in queues if queue.policy.quorum]
    else:
        keeping = ()
    if keeping:
        try:
            handle = vhost.store.append(message, [queue.key for queue in keeping])
        except ValueError as problem:  # e.g. a message bigger than the store can keep in one piece
            raise PreconditionFailed(
                f"the {vhost.store.name} store cannot keep this message: {problem}"
            ) from None
        for queue in queues:
            queue.enqueue(
                message, handle if queue.persisted and (persistent or queue.policy.quorum) else None
            )
    else:
        for queue in queues:
            queue.enqueue(message, None)
    if delaying:
        return len(queues) + len(delaying), True, refused
    return len(queues), handle is not None, refused


def route_onwards(exchange, message, queues, exchanges):
    """
    The queues C{message} reaches from C{exchange} (whose own queues are
    C{queues}) through bindings to other exchanges and alternate exchanges
    (looked up by name in C{exchanges}), as RabbitMQ's rabbit_exchange:route:
    every exchange reached routes it by its own type; one that routes it
    nowhere (to no queue and no exchange) passes it to its alternate exchange;
    no exchange is visited twice, so chains and cycles end and each queue gets
    it once. A loop, not recursion: a chain may be long.

    An x-delayed-message exchange reached through a binding takes a message
    with a valid x-delay header for itself, to be routed when due, and routes
    it nowhere now (as the delayed-message plugin's exchange type does).

    @return: C{(queues, delaying)}: the queues reached now, and the delayed
        exchanges that hold the message back.
    """
    reached = dict.fromkeys(queues)
    delaying = []
    seen = {exchange}
    pending = [exchange]
    while pending:
        current = pending.pop()
        if current is exchange:
            matched = queues
        elif current.delayed and delay_of(message) is not None:
            delaying.append(current)
            continue
        else:
            matched = current.route(message)
        onward = () if current.forwards is None else current.forwards.route(message)
        if matched:
            reached.update(dict.fromkeys(matched))
        elif not onward:
            name = current.alternate_exchange
            alternate = exchanges.get(name) if name is not None else None
            onward = () if alternate is None else (alternate,)
        for destination in onward:
            if destination not in seen:
                seen.add(destination)
                pending.append(destination)
    return list(reached), delaying
