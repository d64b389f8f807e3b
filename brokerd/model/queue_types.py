"""Queue types and the declare arguments RabbitMQ 3.10 knows: which brokerd
honours, which it accepts without effect, and which it refuses.

brokerd has classic queues and quorum queues as far as one node can honour
them (durable only; delivery limits with poison-message handling; every
delivery says its x-delivery-count; no global QoS). Stream queues, and the
arguments of a type that the type does not take, are refused with RabbitMQ's
406 texts, so a declaration that would behave differently here fails instead
of being ignored. Arguments RabbitMQ itself does not know are kept without
effect, as RabbitMQ keeps them.

Checked at declaration only: a queue recovered from the store was accepted
when it was declared.
"""

from brokerd.errors import PreconditionFailed, ResourceLocked
from brokerd.model.queue_arguments import amqp_type_name

QUEUE_TYPE = "x-queue-type"
CLASSIC = "classic"
QUORUM = "quorum"
QUEUE_TYPES = (CLASSIC, QUORUM)

# RabbitMQ names a queue type by its Erlang module in the texts of its refusals.
RABBITMQ_TYPE_MODULES = {CLASSIC: "rabbit_classic_queue", QUORUM: "rabbit_quorum_queue"}

# Arguments a type does not take (RabbitMQ 3.10 refuses them
# "of queue type ..."); any x-stream-* too.
STREAM_ARGUMENTS = ("x-max-age", "x-initial-cluster-size")
REFUSED_BY_TYPE = {
    CLASSIC: frozenset((
        "x-quorum-initial-group-size", "x-max-in-memory-length", "x-max-in-memory-bytes",
        "x-dead-letter-strategy", "x-queue-leader-locator", *STREAM_ARGUMENTS,
    )),
    QUORUM: frozenset((
        "x-max-priority", "x-queue-mode", "x-queue-master-locator", "x-queue-version",
        *STREAM_ARGUMENTS,
    )),
}

# Arguments accepted without effect, each with the values RabbitMQ accepts: on one node with a store
# that pages messages out anyway, where a queue lives and how it keeps its messages change nothing.
QUEUE_MODES = ("default", "lazy")
MASTER_LOCATORS = ("min-masters", "client-local", "random")
QUEUE_VERSIONS = (1, 2)
# Dead letters move in one step here: both hold.
DEAD_LETTER_STRATEGIES = ("at-most-once", "at-least-once")
LEADER_LOCATORS = ("client-local", "balanced")


# The arguments a redeclaration must repeat (RabbitMQ 3.10's list, and x-delivery-limit, which
# brokerd honours on classic queues too); a redeclaration may leave out or change any other.
COMPARED_ARGUMENTS = frozenset((
    "x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key",
    "x-max-length", "x-max-length-bytes", "x-max-in-memory-length", "x-max-in-memory-bytes",
    "x-max-priority", "x-overflow", "x-queue-mode", "x-single-active-consumer", QUEUE_TYPE,
    "x-quorum-initial-group-size", "x-max-age", "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size", "x-queue-leader-locator", "x-queue-version",
    "x-queue-master-locator", "x-delivery-limit", "x-dead-letter-strategy",
))


def check_declaration(queue_name, vhost_name, durable, exclusive, auto_delete, arguments):
    """
    Refuses a new queue's declaration that brokerd would not honour as
    RabbitMQ does, in RabbitMQ's order: argument values, then arguments the
    queue's type does not take, then the properties a quorum queue cannot have.

    @raise PreconditionFailed: with RabbitMQ's text.
    """
    where = f"queue {queue_name!r} in vhost {vhost_name!r}"
    queue_type = arguments.get(QUEUE_TYPE, CLASSIC)
    for name, value in arguments.items():
        problem = _value_problem(name, value)
        if problem is not None:
            raise PreconditionFailed(f"invalid arg {name!r} for {where}: {problem}")
    refused = REFUSED_BY_TYPE[queue_type]
    for name in arguments:
        if name in refused or name.startswith("x-stream-"):
            raise PreconditionFailed(
                f"invalid arg {name!r} for {where}"
                f" of queue type {RABBITMQ_TYPE_MODULES[queue_type]}"
            )
    if queue_type == QUORUM:
        for refused_property, present in (
            ("auto-delete", auto_delete),
            ("exclusive-owner", exclusive),
            ("non-durable", not durable),
        ):
            if present:
                raise PreconditionFailed(f"invalid property {refused_property!r} for {where}")


def comparable_arguments(received, current):
    """
    The parts of a redeclaration's C{received} arguments and the queue's
    C{current} ones that must be equal, as RabbitMQ compares them: the
    arguments it knows (others may differ; the queue keeps its first ones),
    and C{x-queue-type: classic} the same as none.
    """
    received = {name: value for name, value in received.items() if name in COMPARED_ARGUMENTS}
    current = {name: value for name, value in current.items() if name in COMPARED_ARGUMENTS}
    if received.get(QUEUE_TYPE, CLASSIC) == CLASSIC and current.get(QUEUE_TYPE, CLASSIC) == CLASSIC:
        received.pop(QUEUE_TYPE, None)
        current.pop(QUEUE_TYPE, None)
    return received, current


def _value_problem(name, value):
    """What is wrong with the value of the known argument C{name}, in RabbitMQ's words, or None."""
    check = _VALUE_CHECKS.get(name)
    return None if check is None else check(value)


def _unacceptable(value):
    return f"{{unacceptable_type,{amqp_type_name(value)}}}"


def _queue_type(value):
    if not isinstance(value, str):
        return _unacceptable(value)
    if value not in QUEUE_TYPES:
        hint = ": brokerd has classic and quorum queues only" if value == "stream" else ""
        return f"\"unsupported queue type '{value}'\"{hint}"
    return None


def _flag(value):
    return None if isinstance(value, bool) else _unacceptable(value)


def _one_of(choices, what, refusal=None):
    def check(value):
        if not isinstance(value, str):
            return _unacceptable(value)
        if value not in choices:
            return refusal or f"\"unsupported {what} '{value}'\""
        return None

    return check


def _queue_version(value):
    if isinstance(value, bool) or not isinstance(value, int):
        return f"\"expected integer, got {amqp_type_name(value)}\""
    if value not in QUEUE_VERSIONS:
        return f"\"unsupported queue version '{value}'\""
    return None


def _whole(smallest):
    def check(value):
        if isinstance(value, bool) or not isinstance(value, int):
            return f"\"expected integer, got {amqp_type_name(value)}\""
        if value < smallest:
            return f"{{value_zero,{value}}}" if value == 0 else f"{{value_negative,{value}}}"
        return None

    return check


_VALUE_CHECKS = {
    QUEUE_TYPE: _queue_type,
    "x-single-active-consumer": _flag,
    "x-queue-mode": _one_of(QUEUE_MODES, "queue mode"),
    "x-queue-master-locator": _one_of(MASTER_LOCATORS, "queue master locator"),
    "x-queue-version": _queue_version,
    "x-dead-letter-strategy": _one_of(DEAD_LETTER_STRATEGIES, "", "invalid_dlx_strategy"),
    "x-queue-leader-locator": _one_of(LEADER_LOCATORS, "", "invalid_queue_locator_arg"),
    "x-quorum-initial-group-size": _whole(1),
    "x-max-in-memory-length": _whole(0),
    "x-max-in-memory-bytes": _whole(0),
}


def locked_queue(name, vhost_name):
    """
    RabbitMQ 3.10's refusal of an exclusive queue to another connection, or
    of a declare whose C{exclusive} differs from the queue's.
    """
    return ResourceLocked(
        f"cannot obtain exclusive access to locked queue {name!r} in vhost {vhost_name!r}."
        " It could be originally declared on another connection or the exclusive property"
        " value does not match that of the original declaration."
    )
