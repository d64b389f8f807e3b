"""Definitions' C{parameters} and C{global_parameters} sections and the users' C{limits}.

The part of L{brokerd.access.definitions} that carries runtime parameters,
global parameters and limits, in RabbitMQ 3.10's format: a parameter is
C{{"value", "vhost", "component", "name"}} (a one-vhost export keeps its
C{vhost}, as RabbitMQ's does), a global parameter C{{"name", "value"}}, and a
user's limits its entry's C{limits} object. RabbitMQ's own
C{internal_cluster_id} global parameter is read past: it names the cluster it
was exported from. An import that would take a vhost past its C{max-queues}
is refused as RabbitMQ refuses it, before anything changed.
"""

from brokerd.access.parameters import (
    ParameterRefused,
    check_parameter,
    check_user_limits,
    effective_limit,
)

INTERNAL_CLUSTER_ID = "internal_cluster_id"  # RabbitMQ's own, never imported


class ParametersRefused(ValueError):
    """A parameters section that cannot be imported; the message says why."""


def exported_parameters(access, vhost=None):
    """The C{parameters} section: every runtime parameter (of C{vhost} alone if given)."""
    return access.runtime.listed(vhost)


def exported_global_parameters(access):
    return [
        {"name": name, "value": value}
        for name, value in sorted(access.runtime.global_parameters.items())
    ]


def user_limits(entry, name):
    """A user entry's C{limits} checked (None when the entry has none: the user keeps its own)."""
    if "limits" not in entry:
        return None
    try:
        return check_user_limits(entry["limits"])
    except ParameterRefused as refusal:
        raise ParametersRefused(f"users: {refusal} (user '{name}')") from None


def checked_parameters(entries, global_entries, in_vhost):
    """
    C{(parameters, global_parameters)} as lists of checked tuples;
    C{in_vhost(entry, section)} names an entry's vhost, refusing an unknown one.
    """
    parameters = []
    for entry in entries:
        on = in_vhost(entry, "parameters")
        component, name = entry.get("component"), entry.get("name")
        if not isinstance(component, str) or not isinstance(name, str) or "value" not in entry:
            raise ParametersRefused(
                f"parameters: a parameter needs a component, a name and a value ({on})"
            )
        try:
            value = check_parameter(component, name, entry["value"])
        except ParameterRefused as refusal:
            problem = str(refusal).strip()
            raise ParametersRefused(
                f"parameters: {problem} ({component} '{name}' in vhost '{on}')"
            ) from None
        parameters.append((on, component, name, value))
    global_parameters = []
    for entry in global_entries:
        name = entry.get("name")
        if not isinstance(name, str) or not name or "value" not in entry:
            raise ParametersRefused(
                "global_parameters: a global parameter needs a name and a value"
            )
        if name != INTERNAL_CLUSTER_ID:
            global_parameters.append((name, entry["value"]))
    return parameters, global_parameters


def check_queue_limits(broker, access, queues):
    """
    Refuse, in RabbitMQ's words, new C{queues} (C{(vhost, name, ...)} tuples)
    that would take a served vhost past its C{max-queues} as it is now.
    """
    adding = {}
    for on, name, *_ in queues:
        vhost = broker.vhosts.get(on)
        if vhost is not None and name not in vhost.queues:
            adding.setdefault(on, set()).add(name)
    for on, names in adding.items():
        limit = effective_limit(access.runtime.vhost_limits(on), "max-queues")
        count = len(broker.vhosts[on].queues)
        if limit is not None and count + len(names) > limit:
            raise ParametersRefused(
                f'Adding {len(names)} queue(s) to virtual host "{on}" would exceed the limit of'
                f" {limit} queue(s).\n\nThis virtual host currently has {count} queue(s)"
                " defined.\n\nImport aborted!"
            )


def apply_parameters(access, parameters, global_parameters):
    """Keep the checked parameters (each durable before the next)."""
    for on, component, name, value in parameters:
        access.set_parameter(on, component, name, value)
    for name, value in global_parameters:
        access.set_global_parameter(name, value)
