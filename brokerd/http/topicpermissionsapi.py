"""C{/api/topic-permissions} and the users' and vhosts' C{topic-permissions}: RabbitMQ
3.10's resources for topic permissions (L{brokerd.access.topic_permissions}).

As RabbitMQ's management API: an entry is C{{"user", "vhost", "exchange", "write",
"read"}}; C{GET /api/topic-permissions/V/U} lists every entry of user U on vhost V
(404 while there is none, as for an unknown user or vhost), and so does the same
path with an exchange after it; a PUT to either names the exchange in its body
(C{exchange}, C{write}, C{read}, each required: 400 C{[{key_missing,read}]}),
answering 201 when the user had no entry on the vhost and 204 otherwise, 400
C{vhost_or_user_not_found} for an unknown user or vhost; a DELETE of the pair
takes every entry, one with an exchange takes that exchange's (C{amq.default}
naming the default exchange), both 404 while the user has no entry there.
Everything here is for administrators. Changes go through
L{brokerd.access.commands.AccessCommands}, with its checks and log lines.
"""

from brokerd.access.topic_permissions import invalid_expression
from brokerd.http.routes import ApiError, Created, bad_request, json_body, not_found

DEFAULT_EXCHANGE = "amq.default"


def entry(user, vhost, permission):
    return {
        "user": user, "vhost": vhost, "exchange": permission.exchange,
        "write": permission.write, "read": permission.read,
    }


def _entries(api, user=None, vhost=None):
    api.check_administrator()
    return [
        entry(on_user, on_vhost, permission)
        for on_user, on_vhost, permission in api.context.access.topic_permissions.of(user, vhost)
    ]


def list_all(api):
    return _entries(api)


def of_user(api, name):
    api.check_administrator()
    if api.context.access.user(name) is None:
        raise not_found()
    return _entries(api, user=name)


def of_vhost(api, vhost):
    api.check_administrator()
    if not api.context.access.vhost_exists(vhost):
        raise not_found()
    return _entries(api, vhost=vhost)


def get_entries(api, vhost, user, exchange=None):
    """Every entry of C{user} on C{vhost} (an exchange in the path changes nothing)."""
    found = _entries(api, user, vhost)
    if not found:
        raise not_found()
    return found


def put_entry(api, vhost, user, exchange=None):
    api.check_administrator()
    body = json_body(api.request)
    missing = [key for key in ("exchange", "write", "read") if key not in body]
    if missing:
        raise bad_request(f"[{','.join('{key_missing,' + key + '}' for key in missing)}]")
    access = api.context.access
    if not access.vhost_exists(vhost) or access.user(user) is None:
        raise bad_request("vhost_or_user_not_found")
    values = [body[key] for key in ("exchange", "write", "read")]
    if not all(isinstance(value, str) for value in values):
        raise bad_request("exchange, write and read must be strings")
    for expression in values[1:]:
        problem = invalid_expression(expression=expression)
        if problem is not None:
            raise ApiError(400, "bad_request", ["invalid_regexp", expression, problem])
    created = not access.topic_permissions.of(user, vhost)
    d = api.context.management.run(
        api.user, "set_topic_permissions", (user, *values), vhost=vhost
    )
    return d.addCallback(lambda _: Created() if created else None)


def delete_entries(api, vhost, user, exchange=None):
    api.check_administrator()
    if not api.context.access.topic_permissions.of(user, vhost):
        raise not_found()
    arguments = (user,) if exchange is None else (
        user, "" if exchange == DEFAULT_EXCHANGE else exchange
    )
    d = api.context.management.run(api.user, "clear_topic_permissions", arguments, vhost=vhost)
    return d.addCallback(lambda _: None)
