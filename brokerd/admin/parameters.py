"""C{brokerd-admin}'s runtime parameters, global parameters and limits: rabbitmqctl's commands,
in its argument order, as requests to RabbitMQ's management API::

    set-parameter [--vhost V] COMPONENT NAME VALUE   PUT /api/parameters/COMPONENT/V/NAME
                                                     (VALUE is JSON)
    clear-parameter [--vhost V] COMPONENT NAME       DELETE /api/parameters/COMPONENT/V/NAME
    set-global-parameter NAME VALUE                  PUT /api/global-parameters/NAME
    clear-global-parameter NAME                      DELETE /api/global-parameters/NAME
    set-vhost-limits [--vhost V] DEFINITION          PUT /api/parameters/vhost-limits/V/limits
                                                     (replaces them all, as rabbitmqctl's)
    clear-vhost-limits [--vhost V]                   DELETE /api/parameters/vhost-limits/V/limits
    set-user-limits USER DEFINITION                  PUT /api/user-limits/USER/LIMIT, one a limit
                                                     (the others stay, as rabbitmqctl's)
    clear-user-limits USER LIMIT|all                 DELETE /api/user-limits/USER/LIMIT

A DEFINITION is a JSON object such as C{'{"max-connections": 10, "max-queues": 100}'}.
"""

import json

from brokerd.admin.client import AdminError, segment
from brokerd.admin.command import Command, add_vhost_option, done, vhost_of

USER_LIMIT_NAMES = ("max-connections", "max-channels")  # RabbitMQ's user limits


def _json(text, what):
    try:
        return json.loads(text)
    except ValueError as problem:
        raise AdminError(f"{what} is not JSON: {problem}") from None


def _parameter_arguments(parser, with_value=True):
    add_vhost_option(parser)
    parser.add_argument("component", metavar="COMPONENT", help="e.g. vhost-limits")
    parser.add_argument("name", metavar="NAME")
    if with_value:
        parser.add_argument("value", metavar="VALUE", help="JSON")


def _parameter_path(arguments):
    vhost = vhost_of(arguments)
    return vhost, (f"/api/parameters/{segment(arguments.component)}/{segment(vhost)}"
                   f"/{segment(arguments.name)}")


def set_parameter(client, arguments, out):
    vhost, path = _parameter_path(arguments)
    client.send_json("PUT", path, {"value": _json(arguments.value, "the value")})
    done(out, f"Set runtime parameter {arguments.name} for component {arguments.component}"
              f" in vhost {vhost}")


def clear_parameter(client, arguments, out):
    vhost, path = _parameter_path(arguments)
    client.request("DELETE", path)
    done(out, f"Cleared runtime parameter {arguments.name} for component {arguments.component}"
              f" in vhost {vhost}")


def _global_arguments(parser, with_value=True):
    parser.add_argument("name", metavar="NAME", help="e.g. cluster_name")
    if with_value:
        parser.add_argument("value", metavar="VALUE", help='JSON, e.g. \'"east-1"\'')


def set_global_parameter(client, arguments, out):
    client.send_json("PUT", f"/api/global-parameters/{segment(arguments.name)}",
                     {"value": _json(arguments.value, "the value")})
    done(out, f"Set global runtime parameter {arguments.name}")


def clear_global_parameter(client, arguments, out):
    client.request("DELETE", f"/api/global-parameters/{segment(arguments.name)}")
    done(out, f"Cleared global runtime parameter {arguments.name}")


def _vhost_limits_arguments(parser):
    add_vhost_option(parser)
    parser.add_argument("definition", metavar="DEFINITION",
                        help='JSON, e.g. \'{"max-connections": 10, "max-queues": 100}\''
                             " (a negative limit is none, 0 allows none)")


def _limits_path(vhost):
    return f"/api/parameters/vhost-limits/{segment(vhost)}/limits"


def set_vhost_limits(client, arguments, out):
    vhost = vhost_of(arguments)
    client.send_json("PUT", _limits_path(vhost),
                     {"value": _json(arguments.definition, "the definition")})
    done(out, f"Set the limits of vhost {vhost} to {arguments.definition}")


def clear_vhost_limits(client, arguments, out):
    vhost = vhost_of(arguments)
    if client.get_json_if_any(_limits_path(vhost)) is not None:
        client.request("DELETE", _limits_path(vhost))
    done(out, f"Cleared the limits of vhost {vhost}")


def _set_user_limits_arguments(parser):
    parser.add_argument("limited_user", metavar="USER")
    parser.add_argument("definition", metavar="DEFINITION",
                        help='JSON, e.g. \'{"max-connections": 10, "max-channels": 100}\'')


def set_user_limits(client, arguments, out):
    limits = _json(arguments.definition, "the definition")
    if not isinstance(limits, dict):
        raise AdminError(f"the definition must be a JSON object, not {arguments.definition}")
    for name, value in limits.items():
        client.send_json("PUT", f"/api/user-limits/{segment(arguments.limited_user)}"
                                f"/{segment(name)}", {"value": value})
    done(out, f"Set the limits of user {arguments.limited_user} to {arguments.definition}")


def _clear_user_limits_arguments(parser):
    parser.add_argument("limited_user", metavar="USER")
    parser.add_argument("limit", metavar="LIMIT", choices=[*USER_LIMIT_NAMES, "all"],
                        help=f"{', '.join(USER_LIMIT_NAMES)} or all")


def clear_user_limits(client, arguments, out):
    names = USER_LIMIT_NAMES if arguments.limit == "all" else (arguments.limit,)
    for name in names:
        client.request("DELETE", f"/api/user-limits/{segment(arguments.limited_user)}"
                                 f"/{segment(name)}")
    done(out, f"Cleared {arguments.limit} limits of user {arguments.limited_user}")


PARAMETER_COMMANDS = [
    Command("set-parameter", "set a runtime parameter of a vhost (VALUE is JSON)",
            _parameter_arguments, set_parameter),
    Command("clear-parameter", "delete a runtime parameter of a vhost",
            lambda parser: _parameter_arguments(parser, with_value=False), clear_parameter),
    Command("set-global-parameter", "set a global parameter (e.g. cluster_name)",
            _global_arguments, set_global_parameter),
    Command("clear-global-parameter", "delete a global parameter",
            lambda parser: _global_arguments(parser, with_value=False), clear_global_parameter),
]
LIMIT_COMMANDS = [
    Command("set-vhost-limits", "set a vhost's max-connections and max-queues (all of them)",
            _vhost_limits_arguments, set_vhost_limits),
    Command("clear-vhost-limits", "lift every limit of a vhost", add_vhost_option,
            clear_vhost_limits),
    Command("set-user-limits", "set a user's max-connections or max-channels (others stay)",
            _set_user_limits_arguments, set_user_limits),
    Command("clear-user-limits", "lift one limit of a user, or all",
            _clear_user_limits_arguments, clear_user_limits),
]
