"""Policies: RabbitMQ's way of setting queue and exchange options by name pattern.

A policy belongs to a vhost and matches queues and/or exchanges whose names its
pattern (a regular expression) matches; of the policies that match an object,
the one with the highest priority applies. Its definition holds the options
(``message-ttl``, ``max-length``, ``dead-letter-exchange``, ...).
"""

from typing import Any, NamedTuple

APPLY_TO = ("all", "queues", "exchanges")  # RabbitMQ's apply-to values


class Policy(NamedTuple):
    """One policy as RabbitMQ's definitions and its API write it."""

    vhost: str
    name: str
    pattern: str
    definition: dict[str, Any]
    priority: int = 0
    apply_to: str = "all"
