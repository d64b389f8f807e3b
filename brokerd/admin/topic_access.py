"""C{brokerd-admin}'s topic permissions and tracing: rabbitmqctl's C{set_topic_permissions},
C{clear_topic_permissions}, C{trace_on} and C{trace_off}, as requests to RabbitMQ's
management API::

    set-topic-permissions [--vhost V] USER EXCHANGE WRITE READ
                                  PUT /api/topic-permissions/V/USER
    clear-topic-permissions [--vhost V] USER [EXCHANGE]
                                  DELETE /api/topic-permissions/V/USER[/EXCHANGE]
                                  (a user without any there: nothing to do, as rabbitmqctl)
    trace-on [--vhost V]          PUT /api/vhosts/V {"tracing": true}
    trace-off [--vhost V]         PUT /api/vhosts/V {"tracing": false}

C{brokerd-admin list topic_permissions [--vhost V]} lists them.
"""

from brokerd.admin.client import NOT_FOUND, AdminError, segment
from brokerd.admin.command import Command, add_vhost_option, done, vhost_of


def _set_arguments(parser):
    add_vhost_option(parser)
    parser.add_argument("permitted_user", metavar="USER")
    parser.add_argument("exchange", metavar="EXCHANGE", help="the topic exchange's name")
    parser.add_argument("write", metavar="WRITE",
                        help="regular expression of the routing keys USER may publish with;"
                             " {username} and {vhost} stand for the user's and the vhost's names")
    parser.add_argument("read", metavar="READ",
                        help="regular expression of the routing keys USER may bind with")


def set_topic_permissions(client, arguments, out):
    vhost = vhost_of(arguments)
    path = f"/api/topic-permissions/{segment(vhost)}/{segment(arguments.permitted_user)}"
    client.send_json("PUT", path, {
        "exchange": arguments.exchange, "write": arguments.write, "read": arguments.read,
    })
    done(out, f"Set the topic permissions of user {arguments.permitted_user}"
              f" on exchange {arguments.exchange} in vhost {vhost}")


def _clear_arguments(parser):
    add_vhost_option(parser)
    parser.add_argument("permitted_user", metavar="USER")
    parser.add_argument("exchange", nargs="?", metavar="EXCHANGE",
                        help="the exchange whose entry goes (default: every one)")


def clear_topic_permissions(client, arguments, out):
    vhost = vhost_of(arguments)
    path = f"/api/topic-permissions/{segment(vhost)}/{segment(arguments.permitted_user)}"
    if arguments.exchange is not None:
        path += "/" + segment(arguments.exchange or "amq.default")
    try:
        client.request("DELETE", path)
    except AdminError as refusal:
        if refusal.status != NOT_FOUND:
            raise
    on = "" if arguments.exchange is None else f" on exchange {arguments.exchange}"
    done(out, f"Cleared the topic permissions of user {arguments.permitted_user}{on}"
              f" in vhost {vhost}")


def _trace_arguments(parser):
    add_vhost_option(parser)


def _tracing(client, arguments, out, on):
    vhost = vhost_of(arguments)
    path = f"/api/vhosts/{segment(vhost)}"
    if client.get_json_if_any(path) is None:
        raise AdminError(f"Virtual host '{vhost}' does not exist")
    client.send_json("PUT", path, {"tracing": on})
    done(out, f"Tracing {'enabled' if on else 'disabled'} for vhost {vhost}")


def trace_on(client, arguments, out):
    _tracing(client, arguments, out, True)


def trace_off(client, arguments, out):
    _tracing(client, arguments, out, False)


TOPIC_PERMISSION_COMMANDS = [
    Command("set-topic-permissions",
            "give a user two regular expressions for the routing keys of a topic exchange",
            _set_arguments, set_topic_permissions),
    Command("clear-topic-permissions",
            "take a user's topic permissions on a vhost (one exchange's, or all)",
            _clear_arguments, clear_topic_permissions),
]
TRACING_COMMANDS = [
    Command("trace-on", "copy every message published and delivered in a vhost to its"
            " amq.rabbitmq.trace exchange", _trace_arguments, trace_on),
    Command("trace-off", "stop the tracing of a vhost", _trace_arguments, trace_off),
]
