"""Policies as the access database keeps them: checked in RabbitMQ's words, and
handed to the running broker.

L{check_policy} refuses what RabbitMQ's C{rabbit_policy} validation refuses
(a pattern that does not compile, an unknown apply-to, a definition that is
not a non-empty JSON object, a priority that is not an integer) with its
texts; L{publish_policies} gives a vhost's policies, as
L{brokerd.model.policy_effects.Policy} records, to the broker's L{VirtualHost}
after every change and at start, which applies them to its queues and
exchanges.
"""

import json
import re

from brokerd.model.policy_effects import APPLY_TO, Policy

VALIDATION_FAILED = "Validation failed"  # how RabbitMQ's rabbit_runtime_parameters begins a refusal


class PolicyRefused(ValueError):
    """A policy RabbitMQ would refuse; the message is its text."""


def check_policy(vhost, name, pattern, definition, priority=0, apply_to="all"):
    """
    The L{Policy} these make, or raise L{PolicyRefused} with RabbitMQ's words
    for what is wrong.
    """
    if not isinstance(name, str) or not name:
        raise PolicyRefused(f"policy in virtual host '{vhost}' has undefined name")
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise PolicyRefused(
            f"{VALIDATION_FAILED}: priority should be a number, actually was {priority!r}"
        )
    if not isinstance(pattern, str):
        raise PolicyRefused(f"{VALIDATION_FAILED}: pattern should be a binary but was {pattern!r}")
    try:
        re.compile(pattern)
    except re.error as problem:
        raise PolicyRefused(
            f"{VALIDATION_FAILED}: pattern should be regular expression but is invalid:"
            f" {problem}"
        ) from None
    if apply_to not in APPLY_TO:
        raise PolicyRefused(
            f"{VALIDATION_FAILED}: apply-to '{apply_to}' unrecognised; should be 'queues',"
            f" 'exchanges' or 'all'"
        )
    if not isinstance(definition, dict):
        raise PolicyRefused(
            f"{VALIDATION_FAILED}: definition must be a dictionary: {json.dumps(definition)}"
        )
    if not definition:
        raise PolicyRefused(f"{VALIDATION_FAILED}: no policy provided")
    return Policy(vhost, name, pattern, dict(definition), priority, apply_to)


def parse_priority(text):
    """
    A priority given as text (the command line's): the integer, or
    L{PolicyRefused} as RabbitMQ words it.
    """
    try:
        return int(text)
    except (TypeError, ValueError):
        raise PolicyRefused(f"{text!r} priority must be a number") from None


def parse_definition(text):
    """A definition given as JSON text: the object, or L{PolicyRefused} as RabbitMQ words it."""
    try:
        return json.loads(text)
    except ValueError as problem:
        raise PolicyRefused(f"JSON decoding error. Reason: {problem}") from None


def publish_policies(broker, access, vhost_name):
    """
    Tell the running broker's vhost C{vhost_name} its policies now (all of
    them, highest priority first), which it applies to its queues and
    exchanges; a vhost not being served (unknown, or its store down) has
    nothing to tell.
    """
    vhost = broker.vhosts.get(vhost_name)
    if vhost is not None:
        vhost.set_policies(access.policies(vhost_name))


def publish_all_policies(broker, access):
    """Tell every vhost the broker serves its policies (at start, and after an import)."""
    for name in list(broker.vhosts):
        publish_policies(broker, access, name)
