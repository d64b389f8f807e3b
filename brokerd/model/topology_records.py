"""The store's records of a vhost's durable topology, and the redeclare check.

Records are what L{brokerd.interfaces.IMessageStore} keeps for durable
exchanges, queues and bindings; the check refuses a redeclaration whose
attributes or compared arguments differ, with RabbitMQ's 406 text.
"""

from brokerd.errors import PreconditionFailed
from brokerd.model.queue_arguments import argument_difference
from brokerd.proto import messages_pb2
from brokerd.proto.exchange_types import EXCHANGE_TYPE_BY_NAME
from brokerd.proto.tables import dict_to_table, freeze


def exchange_record(vhost_name, exchange):
    return messages_pb2.ExchangeRecord(
        vhost=vhost_name,
        name=exchange.name,
        type=EXCHANGE_TYPE_BY_NAME[exchange.type_name],
        durable=exchange.durable,
        auto_delete=exchange.auto_delete,
        internal=exchange.internal,
        arguments=dict_to_table(exchange.arguments),
    )


def queue_record(vhost_name, name, auto_delete, arguments):
    return messages_pb2.QueueRecord(
        vhost=vhost_name, name=name, durable=True, auto_delete=auto_delete,
        arguments=dict_to_table(arguments),
    )


def binding_record(vhost_name, binding):
    """A binding to a queue names it in C{queue}; one to an exchange in C{destination_exchange}."""
    if binding.to_exchange:
        ends = {"destination_exchange": binding.destination.name}
    else:
        ends = {"queue": binding.destination.name}
    return messages_pb2.BindingRecord(
        vhost=vhost_name,
        exchange=binding.exchange.name,
        routing_key=binding.routing_key,
        arguments=dict_to_table(binding.arguments),
        **ends,
    )


def flags(**pairs):
    """C{name=(received, current)} booleans as RabbitMQ prints them in its inequivalent-arg text."""
    return {name: (_flag(received), _flag(current)) for name, (received, current) in pairs.items()}


def _flag(value):
    return "true" if value else "false"


def check_equivalent(vhost_name, kind, name, attributes, arguments, current_arguments):
    """Refuse (406) a redeclaration of C{kind} C{name} whose attributes or arguments differ."""
    for attribute, (received, current) in attributes.items():
        if received != current:
            raise PreconditionFailed(
                f"inequivalent arg {attribute!r} for {kind} {name!r} in vhost {vhost_name!r}:"
                f" received {received!r} but current is {current!r}"
            )
    if freeze(arguments) != freeze(current_arguments):
        for key in sorted(set(arguments) | set(current_arguments)):
            received, current = arguments.get(key), current_arguments.get(key)
            if freeze(received) != freeze(current):
                raise PreconditionFailed(
                    f"inequivalent arg {key!r} for {kind} {name!r} in vhost {vhost_name!r}:"
                    f" {argument_difference(received, current)}"
                )
