"""Policies, RabbitMQ's way of setting queue and exchange options by name pattern, and what a
vhost's policies do to its queues and exchanges, as RabbitMQ 3.10 applies them.

A policy (L{Policy}) belongs to a vhost and matches queues and/or exchanges whose
names its pattern matches; its definition holds the options (``message-ttl``,
``max-length``, ``dead-letter-exchange``, ...).

Of the policies whose pattern matches an object's name (a regular
expression searched for anywhere in it, as ``re:run``), whose apply-to fits
its kind and whose keys its type supports (rabbit_policy:matches/2 and
rabbit_queue_type:is_policy_applicable/2), the one with the highest priority
applies; at equal priority, the one whose name sorts first.

A queue's effective settings are its own x-arguments merged with the
policy's keys, once, when the policy or the queue changes (never per
message), with RabbitMQ's precedence (rabbit_amqqueue_process:process_args_policy/1
for classic queues, rabbit_quorum_queue:ra_machine_config/1 for quorum ones):
for ``message-ttl``, ``max-length``, ``max-length-bytes``, ``delivery-limit``
(and brokerd's ``backlog-alarm``, and ``consumer-timeout``, which RabbitMQ has from 3.12)
the lower value wins; for
``dead-letter-exchange`` and ``dead-letter-routing-key`` the queue's own
argument wins; ``overflow`` and ``expires`` go to the queue's argument on
classic queues (``expires``: the lower value) and to the policy on quorum
queues. An exchange's own ``alternate-exchange`` argument wins over the
policy's (rabbit_policy:get_arg/3). A value RabbitMQ's validation would
refuse (rabbit_policies:validate_policy0/2; L{definition_problem} gives its
text, for those who refuse such a policy as RabbitMQ does), and any other key,
is kept in the definition but not applied.
"""

import copy
import re
from typing import Any, NamedTuple

from twisted.logger import Logger

from brokerd.model.queue_arguments import OVERFLOW_MODES, erlang_term

log = Logger()

APPLY_TO = ("all", "queues", "exchanges")  # RabbitMQ's apply-to values


class Policy(NamedTuple):
    """One policy as RabbitMQ's definitions and its API write it."""

    vhost: str
    name: str
    pattern: str
    definition: dict[str, Any]
    priority: int = 0
    apply_to: str = "all"


_LOWER = "lower"  # the lower of the policy's value and the object's own argument
_OWN = "own"  # the object's own argument, else the policy's value
_POLICY = "policy"  # the policy's value


def _whole(smallest):
    return lambda value: (
        isinstance(value, int) and not isinstance(value, bool) and value >= smallest
    )


def _text(value):
    return isinstance(value, str)


def _overflow(value):
    return value in OVERFLOW_MODES


# key -> (QueueArguments attribute, check of the policy's value,
# precedence on a classic queue, on a quorum queue)
QUEUE_KEYS = {
    "message-ttl": ("message_ttl", _whole(0), _LOWER, _LOWER),
    "expires": ("expires", _whole(1), _LOWER, _POLICY),
    "max-length": ("max_length", _whole(0), _LOWER, _LOWER),
    "max-length-bytes": ("max_length_bytes", _whole(0), _LOWER, _LOWER),
    "overflow": ("overflow", _overflow, _OWN, _POLICY),
    "dead-letter-exchange": ("dead_letter_exchange", _text, _OWN, _OWN),
    "dead-letter-routing-key": ("dead_letter_routing_key", _text, _OWN, _OWN),
    "delivery-limit": ("delivery_limit", _whole(0), _LOWER, _LOWER),
    "backlog-alarm": ("backlog_alarm", _whole(0), _LOWER, _LOWER),
    "consumer-timeout": ("consumer_timeout", _whole(0), _LOWER, _LOWER),
}
EXCHANGE_KEYS = {"alternate-exchange": _text}

# Keys that make a whole policy inapplicable to a queue type (the types' capabilities/0 in
# RabbitMQ 3.10); brokerd honours delivery-limit on classic queues too, so it does not stop a
# policy there.
_STREAM_KEYS = ("max-age", "stream-max-segment-size-bytes", "initial-cluster-size")
UNSUPPORTED_BY_CLASSIC = frozenset((*_STREAM_KEYS, "queue-leader-locator", "dead-letter-strategy"))
UNSUPPORTED_BY_QUORUM = frozenset((
    *_STREAM_KEYS, "max-priority", "queue-mode", "single-active-consumer", "ha-mode", "ha-params",
    "ha-sync-mode", "ha-promote-on-shutdown", "ha-promote-on-failure", "queue-master-locator",
))


class VhostPolicies:
    """
    The policies of one vhost, ordered for matching: C{for_queue} and
    C{for_exchange} say which one applies to an object.
    """

    def __init__(self, vhost_name, policies=()):
        usable = []
        for policy in policies:
            if policy.vhost != vhost_name:
                continue
            try:
                pattern = re.compile(policy.pattern)
            except (re.error, TypeError) as problem:
                log.warn(
                    "policy {policy!r} in vhost {vhost!r} is not applied: its pattern {pattern!r}"
                    " is not a regular expression: {problem}",
                    policy=policy.name, vhost=vhost_name, pattern=policy.pattern, problem=problem,
                )
                continue
            usable.append((policy, pattern))
        usable.sort(key=lambda pair: (-pair[0].priority, pair[0].name))
        self.policies = [policy for policy, _ in usable]
        self._ordered = usable

    def apply_to_all(self, queues, exchanges):
        """
        Give each of C{queues} and C{exchanges} the policy that now applies to
        it, where that changed.
        """
        for queue in queues:
            policy = self.for_queue(queue.name, queue.policy.quorum)
            if policy != queue.applied_policy:
                apply_to_queue(queue, policy)
        for exchange in exchanges:
            policy = self.for_exchange(exchange.name)
            if policy != exchange.applied_policy:
                apply_to_exchange(exchange, policy)

    def apply_to_new_queue(self, queue):
        """Give a queue just declared or restored the policy that applies to it, if any."""
        if self._ordered:
            apply_to_queue(queue, self.for_queue(queue.name, queue.policy.quorum))

    def apply_to_new_exchange(self, exchange):
        """Give an exchange just declared or restored the policy that applies to it, if any."""
        if self._ordered:
            apply_to_exchange(exchange, self.for_exchange(exchange.name))

    def for_queue(self, name, quorum):
        """
        The policy that applies to the queue called C{name} (a quorum queue if
        C{quorum}), or None.
        """
        unsupported = UNSUPPORTED_BY_QUORUM if quorum else UNSUPPORTED_BY_CLASSIC
        for policy, pattern in self._ordered:
            if (policy.apply_to in ("all", "queues") and pattern.search(name)
                    and unsupported.isdisjoint(policy.definition)):
                return policy
        return None

    def for_exchange(self, name):
        """
        The policy that applies to the exchange called C{name}, or None (the
        default exchange has none).
        """
        if name == "":
            return None
        for policy, pattern in self._ordered:
            if policy.apply_to in ("all", "exchanges") and pattern.search(name):
                return policy
        return None


# What RabbitMQ's validation says of a bad value
# (rabbit_policies:validate_policy0/2), for the keys applied here.
_REFUSALS = {
    "message-ttl": "is not a valid message TTL",
    "expires": "is not a valid queue expiry",
    "max-length": "is not a valid maximum length",
    "max-length-bytes": "is not a valid maximum length in bytes",
    "overflow": "is not a valid overflow value",
    "dead-letter-exchange": "is not a valid dead letter exchange name",
    "dead-letter-routing-key": "is not a valid dead letter routing key",
    "delivery-limit": "is not a valid delivery limit",
    "backlog-alarm": "is not a valid backlog alarm",
    "consumer-timeout": "is not a valid consumer timeout",
    "alternate-exchange": "is not a valid alternate exchange name",
}


def definition_problem(definition):
    """
    What RabbitMQ's validation would say of the first bad value in a policy
    C{definition} among the keys brokerd applies (e.g. C{-1 is not a valid
    maximum length}, the value as Erlang prints it), or None if they are all good.
    """
    for key, value in definition.items():
        check = QUEUE_KEYS[key][1] if key in QUEUE_KEYS else EXCHANGE_KEYS.get(key)
        if check is not None and not check(value):
            return f"{erlang_term(value)} {_REFUSALS[key]}"
    return None


def unapplied_keys(policy):
    """The keys of C{policy}'s definition that brokerd applies to none of the
    objects its apply-to names, or whose value RabbitMQ would refuse, sorted."""
    applied = {}
    if policy.apply_to in ("all", "queues"):
        applied.update((key, check) for key, (_, check, _, _) in QUEUE_KEYS.items())
    if policy.apply_to in ("all", "exchanges"):
        applied.update(EXCHANGE_KEYS)
    return sorted(
        key for key, value in policy.definition.items()
        if key not in applied or not applied[key](value)
    )


def queue_settings(own, arguments, definition):
    """
    The effective settings of a queue whose own settings are C{own} (a
    L{brokerd.model.queue_arguments.QueueArguments} made from its declare
    C{arguments}) under a policy C{definition} (or None): C{own} itself if the
    policy changes nothing, else a copy with the policy's values merged in.
    """
    if not definition:
        return own
    settings = None
    for key, (attribute, check, classic_rule, quorum_rule) in QUEUE_KEYS.items():
        value = definition.get(key)
        if value is None or not check(value):
            continue
        rule = quorum_rule if own.quorum else classic_rule
        mine = getattr(own, attribute) if "x-" + key in arguments else None
        if mine is not None and rule == _OWN:
            continue
        if mine is not None and rule == _LOWER:
            value = min(value, mine)
        if settings is None:
            settings = copy.copy(own)
        setattr(settings, attribute, value)
    return own if settings is None else settings


def apply_to_queue(queue, policy):
    """Make C{policy} (or none) the queue's: its effective settings change now, if they differ."""
    queue.applied_policy = policy
    definition = None if policy is None else policy.definition
    settings = queue_settings(queue.own_settings, queue.arguments, definition)
    if vars(settings) != vars(queue.policy):
        queue.change_settings(settings)


def apply_to_exchange(exchange, policy):
    """Make C{policy} (or none) the exchange's: its effective alternate exchange follows."""
    exchange.applied_policy = policy
    own = exchange.arguments.get("alternate-exchange")
    if isinstance(own, str):
        exchange.alternate_exchange = own
        return
    from_policy = None if policy is None else policy.definition.get("alternate-exchange")
    exchange.alternate_exchange = from_policy if isinstance(from_policy, str) else None
