"""The deterministic side of a workload: its topology, every publisher's messages
and every consumer's settle decisions, all drawn from the settings' seed.

The same settings give the same plan in any process and on any backend, so the
runs of one workload against several backends can be compared message by
message. The plan routes each message through its own copy of the bindings
(the AMQP rules for direct, fanout, topic and headers exchanges): the queues it
names are what a correct broker must deliver to, not what the broker said.
"""

import hashlib
import random
from dataclasses import dataclass, field
from typing import NamedTuple

from spark_jobs.events import ACK, NACK, REJECT, message_id
from spark_jobs.settings import EXCHANGE_TYPES

EXCHANGE_PREFIX = "wl."
CONSUMED_QUEUE_PREFIX = "wl.q"
PARKED_QUEUE_PREFIX = "wl.parked"
# Share of messages routed toward a parked queue: small, because parked queues
# are never drained and their backlog stays in the broker's memory on stores
# that do not page bodies out.
PARKED_SHARE = 0.02
# A message is nacked with requeue at most this many times per queue, so that
# every run ends however high the nack share is: counted by the broker's
# x-delivery-count, or on a broker without it (RabbitMQ's classic queues) by
# each consumer for itself, so at most consumers x MAX_NACKS times there.
MAX_NACKS = 3
# Bodies are a per-message prefix followed by a slice of one seeded block, taken
# at a random offset below this: cheap to make, and different from each other.
FILLER_OFFSETS = 4096


@dataclass(frozen=True)
class Binding:
    """One queue binding: C{arguments} are the headers exchange's match arguments."""

    exchange: str
    queue: str
    routing_key: str = ""
    arguments: dict = field(default_factory=dict)

    def to_json(self):
        return {"exchange": self.exchange, "queue": self.queue, "routing_key": self.routing_key,
                "arguments": dict(self.arguments)}


@dataclass(frozen=True)
class Route:
    """What a publisher may put on one message for one exchange: a routing key and headers."""

    exchange: str
    routing_key: str = ""
    headers: dict = None


class PlannedMessage(NamedTuple):
    """One message of the plan, with the sorted names of the queues it must reach."""

    publisher: int
    seq: int
    message_id: str
    exchange: str
    routing_key: str
    headers: dict
    priority: int
    body: bytes
    queues: tuple

    @property
    def size(self):
        return len(self.body)


class Topology:
    """
    The workload's exchanges (C{wl.<type>}, one per configured type), consumed
    queues (C{wl.q0}...), parked queues (C{wl.parked0}...) and bindings, all
    durable, and the routes publishers choose from.

    @ivar consumed_routes: per exchange, the routes that reach consumed queues.
    @ivar parked_routes: per exchange, the routes that reach a parked queue
        (empty for fanout, which never feeds a parked queue).
    """

    def __init__(self, exchanges, queues, parked, queue_arguments, bindings, consumed_routes,
                 parked_routes):
        self.exchanges = exchanges
        self.queues = queues
        self.parked = parked
        self.queue_arguments = queue_arguments
        self.bindings = bindings
        self.consumed_routes = consumed_routes
        self.parked_routes = parked_routes
        self._routed = {}

    @property
    def all_queues(self):
        return self.queues + self.parked

    def route(self, exchange, routing_key, headers=None):
        """The sorted queue names a message published to C{exchange} reaches, by the AMQP rules."""
        key = (exchange, routing_key, tuple(sorted((headers or {}).items())))
        queues = self._routed.get(key)
        if queues is None:
            kind = self.exchanges.get(exchange)
            if kind is None:
                raise ValueError(f"the workload has no exchange {exchange!r};"
                                 f" it has {sorted(self.exchanges)}")
            matched = {binding.queue for binding in self.bindings
                       if binding.exchange == exchange
                       and _binding_matches(kind, binding, routing_key, headers or {})}
            queues = self._routed[key] = tuple(sorted(matched))
        return queues

    def to_json(self):
        """A dict for run.json."""
        return {
            "exchanges": dict(self.exchanges),
            "queues": list(self.queues),
            "parked": list(self.parked),
            "queue_arguments": dict(self.queue_arguments),
            "bindings": [binding.to_json() for binding in self.bindings],
        }


def check_settings(settings):
    """Raises ValueError naming every setting a workload cannot run with."""
    wrong = []
    for name, smallest in (("messages", 1), ("queues", 1), ("parked_queues", 0),
                           ("publishers", 1), ("consumers", 0), ("prefetch", 1),
                           ("max_priority", 0), ("crash_every", 0)):
        value = getattr(settings, name)
        if not isinstance(value, int) or value < smallest:
            wrong.append(f"{name} must be a whole number of at least {smallest}, not {value!r}")
    if settings.max_priority > 255:
        wrong.append(f"max_priority must be at most 255 (x-max-priority),"
                     f" not {settings.max_priority}")
    if not settings.sizes or not all(isinstance(size, int) and size >= 1
                                     for size in settings.sizes):
        wrong.append(f"sizes must be byte counts of at least 1, not {settings.sizes!r}")
    unknown = [kind for kind in settings.exchange_types if kind not in EXCHANGE_TYPES]
    if not settings.exchange_types or unknown:
        wrong.append(f"exchange_types must be some of {', '.join(EXCHANGE_TYPES)},"
                     f" not {settings.exchange_types!r}")
    for name in ("nack_share", "reject_share"):
        if not 0.0 <= getattr(settings, name) <= 1.0:
            wrong.append(f"{name} must be between 0 and 1, not {getattr(settings, name)!r}")
    if settings.nack_share + settings.reject_share > 1.0:
        wrong.append(f"nack_share + reject_share must be at most 1,"
                     f" not {settings.nack_share + settings.reject_share}")
    if wrong:
        raise ValueError("workload settings: " + "; ".join(wrong))


def build_topology(settings):
    """The L{Topology} of C{settings}: every route reaches at least one queue, some reach two or
    more."""
    queues = [f"{CONSUMED_QUEUE_PREFIX}{number}" for number in range(settings.queues)]
    parked = [f"{PARKED_QUEUE_PREFIX}{number}" for number in range(settings.parked_queues)]
    exchanges = {f"{EXCHANGE_PREFIX}{kind}": kind for kind in settings.exchange_types}
    arguments = {"x-max-priority": settings.max_priority} if settings.max_priority > 0 else {}
    bindings, consumed_routes, parked_routes = [], {}, {}
    first, last = queues[0], queues[-1]
    for name, kind in exchanges.items():
        if kind == "direct":
            # Each queue under its own key, and one key shared by the first and the last queue.
            bindings += [Binding(name, queue, _short(queue)) for queue in queues + parked]
            bindings += [Binding(name, queue, "pair") for queue in sorted({first, last})]
            consumed = [Route(name, _short(queue)) for queue in queues] + [Route(name, "pair")]
            to_parked = [Route(name, _short(queue)) for queue in parked]
        elif kind == "fanout":
            # Fanout to the first and the last queue (one queue when there is one).
            bindings += [Binding(name, queue) for queue in sorted({first, last})]
            consumed, to_parked = [Route(name)], []
        elif kind == "topic":
            # t.<queue>.<word>: every word reaches its queue; "hot" ones the last queue too.
            bindings += [Binding(name, queue, f"t.{_short(queue)}.*") for queue in queues]
            bindings += [Binding(name, last, "#.hot")]
            bindings += [Binding(name, queue, f"t.{_short(queue)}.#") for queue in parked]
            consumed = [Route(name, f"t.{_short(queue)}.{word}")
                        for queue in queues for word in ("plain", "hot")]
            to_parked = [Route(name, f"t.{_short(queue)}.plain") for queue in parked]
        else:
            # Headers: "target" picks a queue (x-match all); "audit" also reaches the first
            # (x-match any).
            bindings += [Binding(name, queue, "", {"x-match": "all", "target": _short(queue)})
                         for queue in queues + parked]
            bindings += [Binding(name, first, "",
                                 {"x-match": "any", "audit": "yes", "urgent": "yes"})]
            consumed = [Route(name, "", {"target": _short(queue), "audit": audit})
                        for queue in queues for audit in ("yes", "no")]
            to_parked = [Route(name, "", {"target": _short(queue), "audit": "no"})
                         for queue in parked]
        consumed_routes[name], parked_routes[name] = consumed, to_parked
    return Topology(exchanges, queues, parked, {queue: arguments for queue in queues + parked},
                    bindings, consumed_routes, parked_routes)


def _short(queue):
    """``wl.q3`` -> ``q3``: the word a queue is known by in routing keys and headers."""
    return queue[len(EXCHANGE_PREFIX):]


def _binding_matches(kind, binding, routing_key, headers):
    if kind == "fanout":
        return True
    if kind == "direct":
        return binding.routing_key == routing_key
    if kind == "topic":
        return topic_matches(binding.routing_key, routing_key)
    return headers_match(binding.arguments, headers)


def topic_matches(pattern, routing_key):
    """AMQP topic matching: C{*} is one word, C{#} zero or more."""
    return _words_match(pattern.split("."), routing_key.split("."))


def _words_match(pattern, words):
    if not pattern:
        return not words
    if pattern[0] == "#":
        return any(_words_match(pattern[1:], words[start:]) for start in range(len(words) + 1))
    return bool(words) and pattern[0] in ("*", words[0]) and _words_match(pattern[1:], words[1:])


def headers_match(arguments, headers):
    """The headers exchange's rule: C{x-match} all (default) or any over the non-C{x-} arguments."""
    wanted = [(name, value) for name, value in arguments.items() if not name.startswith("x-")]
    found = [headers.get(name) == value for name, value in wanted]
    return any(found) if arguments.get("x-match", "all") == "any" else all(found)


def publisher_message_count(settings, publisher):
    """How many of the C{settings.messages} publisher C{publisher} sends: an even share."""
    if not 0 <= publisher < settings.publishers:
        raise ValueError(f"publisher {publisher} is not one of the workload's"
                         f" {settings.publishers}")
    share, extra = divmod(settings.messages, settings.publishers)
    return share + (1 if publisher < extra else 0)


def publisher_messages(settings, topology, publisher):
    """Publisher C{publisher}'s messages in publish order (seq 0, 1, ...), as L{PlannedMessage}s."""
    rng = random.Random(f"brokerd-workload/{settings.seed}/publisher/{publisher}")
    filler = random.Random(f"brokerd-workload/{settings.seed}/filler/{publisher}").randbytes(
        max(settings.sizes) + FILLER_OFFSETS)
    # Each exchange's routes with the queues they reach, worked out once.
    routes = [(exchange, [(route, topology.route(exchange, route.routing_key, route.headers))
                          for route in topology.consumed_routes[exchange]],
               [(route, topology.route(exchange, route.routing_key, route.headers))
                for route in topology.parked_routes[exchange]])
              for exchange in topology.exchanges]
    sizes, top_priority = settings.sizes, settings.max_priority
    random_draw, choice = rng.random, rng.choice
    for seq in range(publisher_message_count(settings, publisher)):
        exchange, consumed, parked = choice(routes)
        route, queues = choice(parked if parked and random_draw() < PARKED_SHARE else consumed)
        size = choice(sizes)
        priority = int(random_draw() * (top_priority + 1)) if top_priority else 0
        identifier = message_id(publisher, seq)
        prefix = f"{identifier}/{settings.seed}|".encode()
        if size <= len(prefix):
            body = prefix[:size]
        else:
            start = int(random_draw() * FILLER_OFFSETS)
            body = prefix + filler[start:start + size - len(prefix)]
        yield PlannedMessage(publisher, seq, identifier, exchange, route.routing_key, route.headers,
                             priority, body, queues)


def settle_decision(settings, message_id, queue, delivery_count):
    """
    How a consumer settles a delivery: C{"nack"} (requeue), C{"reject"} (no
    requeue) or C{"ack"}, drawn from the seed, the message, the queue and how
    often the message came back to that queue before (x-delivery-count, or
    the consumer's own count where the broker sends none:
    L{spark_jobs.client_logs.returns_before}), so every backend sees the same
    decisions for the same deliveries. After L{MAX_NACKS} returns a message is
    no longer nacked.
    """
    key = f"{settings.seed}/{message_id}/{queue}/{delivery_count}".encode()
    digest = hashlib.blake2b(key, digest_size=8)
    draw = int.from_bytes(digest.digest(), "big") / 2**64
    if draw < settings.nack_share:
        return NACK if delivery_count < MAX_NACKS else ACK
    if draw < settings.nack_share + settings.reject_share:
        return REJECT
    return ACK
