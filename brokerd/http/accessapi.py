"""C{/api/vhosts}, C{/api/users} and C{/api/permissions}: rabbitmqctl's commands over HTTP.

Changes go through L{brokerd.access.commands.AccessCommands} (the same checks,
durability and log lines as the native protocol's commands), except a user
given by C{password_hash}, which the access database takes as it is.
A PUT answers 201 when it created the object and 204 when it changed one.
"""

from twisted.internet import defer
from twisted.logger import Logger

from brokerd.access.commands import format_tags
from brokerd.access.database import AccessChangeRefused
from brokerd.access.passwords import HASHING_ALGORITHM, hash_password
from brokerd.access.tracing_commands import tracing
from brokerd.http.overview import unacked_by_queue
from brokerd.http.routes import ApiError, Created, bad_request, json_body, not_found

log = Logger()


def _run(api, command, *arguments, vhost=None):
    return api.context.management.run(api.user, command, arguments, vhost=vhost)


def _answer(created):
    return Created() if created else None


# -- vhosts

def vhost_info(api, name, unacked):
    broker = api.context.broker
    vhost = broker.vhosts.get(name)
    ready = sum(queue.message_count for queue in vhost.queues.values()) if vhost is not None else 0
    pending = sum(count for (on, _), count in unacked.items() if on == name)
    return {
        "name": name, "description": "", "tags": [], "default_queue_type": "classic",
        "metadata": {"description": "", "tags": []},
        "tracing": tracing(vhost), "messages": ready + pending, "messages_ready": ready,
        "messages_unacknowledged": pending,
        "cluster_state": {api.context.node: "running" if vhost is not None else "stopped"},
    }


def list_vhosts(api):
    unacked = unacked_by_queue(api.context.broker)
    return [vhost_info(api, name, unacked) for name in sorted(api.visible_vhosts())]


def get_vhost(api, vhost):
    return vhost_info(api, api.vhost_named(vhost), unacked_by_queue(api.context.broker))


def put_vhost(api, vhost):
    """
    Create vhost C{vhost} (201; one that exists is left as it is, 204). Besides
    RabbitMQ's fields, which brokerd does not keep, the JSON body may carry
    brokerd's own C{"backend"}: a backend string (C{"sqlite"},
    C{"chunked:chunk_size=64M"}) giving the new vhost a store of its own, as
    C{add-vhost --backend} does; without it the vhost is on the broker's store.
    A backend string the broker cannot use is 400, in its words. RabbitMQ's
    C{"tracing"} (a boolean, or C{"true"}/C{"false"}) turns the vhost's
    firehose on or off, as C{trace_on} and C{trace_off}.
    """
    body = json_body(api.request)
    backend = body.get("backend")
    if backend is not None and not isinstance(backend, str):
        raise bad_request("backend must be a backend string, such as sqlite")
    trace = body.get("tracing")
    if trace is not None and trace not in (True, False, "true", "false"):
        raise ApiError(400, "bad_request", ["not_boolean", trace])  # RabbitMQ's parse_bool
    created = not api.context.access.vhost_exists(vhost)
    d = api.context.management.run(api.user, "add_vhost", (vhost,), backend=backend or None)
    if trace is not None:
        command = "trace_on" if trace in (True, "true") else "trace_off"
        d.addCallback(lambda _: api.context.management.run(api.user, command, (), vhost=vhost))
    return d.addCallback(lambda _: _answer(created))


def delete_vhost(api, vhost):
    api.check_administrator()
    return _run(api, "delete_vhost", vhost).addCallback(lambda _: None)


# -- users

def user_info(user):
    return {
        "name": user.name, "password_hash": user.password_hash or "",
        "hashing_algorithm": HASHING_ALGORITHM, "tags": list(user.tags),
        "limits": dict(user.limits),
    }


def list_users(api):
    api.check_administrator()
    access = api.context.access
    return [user_info(access.users[name]) for name in sorted(access.users)]


def get_user(api, name):
    api.check_administrator()
    user = api.context.access.user(name)
    if user is None:
        raise not_found()
    return user_info(user)


def parse_tags(tags):
    """Tags as RabbitMQ's API takes them: a list, or one comma-separated string."""
    if tags is None:
        return ()
    if isinstance(tags, str):
        return tuple(tag.strip() for tag in tags.split(",") if tag.strip())
    if isinstance(tags, list) and all(isinstance(tag, str) for tag in tags):
        return tuple(tag.strip() for tag in tags if tag.strip())
    raise bad_request("tags must be a list or a comma-separated string")


def put_user(api, name):
    api.check_administrator()
    body = json_body(api.request)
    tags = parse_tags(body.get("tags"))
    access = api.context.access
    created = access.user(name) is None
    if "password" in body:
        password = body["password"]
        if not isinstance(password, str):
            raise bad_request("password must be a string")
        password_hash = hash_password(password)
    elif "password_hash" in body:
        algorithm = body.get("hashing_algorithm", HASHING_ALGORITHM)
        if algorithm != HASHING_ALGORITHM:
            raise bad_request(
                f"hashing algorithm {algorithm!r} is not supported; use {HASHING_ALGORITHM}"
            )
        password_hash = body["password_hash"] or None
    elif created:
        raise bad_request("Must specify password or password_hash")  # RabbitMQ's words
    else:
        password_hash = access.user(name).password_hash
    try:
        access.set_password_hash(name, password_hash, tags)
    except AccessChangeRefused as problem:
        raise bad_request(str(problem)) from None
    except OSError as problem:
        raise bad_request(f"the change could not be saved: {problem}") from None
    log.info(
        "{what} user '{name}' with tags {tags} (by user '{acting_user}')",
        what="Created" if created else "Updated", name=name, tags=format_tags(tags),
        acting_user=api.user,
    )
    return defer.succeed(_answer(created))


def delete_user(api, name):
    api.check_administrator()
    return _run(api, "delete_user", name).addCallback(lambda _: None)


# -- permissions

def permission_info(user, vhost, permissions):
    return {
        "user": user, "vhost": vhost, "configure": permissions.configure,
        "write": permissions.write, "read": permissions.read,
    }


def _permissions(api, keep):
    api.check_administrator()
    return [
        permission_info(user, vhost, permissions)
        for (user, vhost), permissions in sorted(api.context.access.permissions.items())
        if keep(user, vhost)
    ]


def list_permissions(api):
    return _permissions(api, lambda user, vhost: True)


def vhost_permissions(api, vhost):
    api.check_administrator()
    api.vhost_named(vhost)
    return _permissions(api, lambda user, on: on == vhost)


def user_permissions(api, name):
    api.check_administrator()
    if api.context.access.user(name) is None:
        raise not_found()
    return _permissions(api, lambda user, vhost: user == name)


def get_permission(api, vhost, user):
    api.check_administrator()
    permissions = api.context.access.permissions_of(user, vhost)
    if permissions is None:
        raise not_found()
    return permission_info(user, vhost, permissions)


def put_permission(api, vhost, user):
    api.check_administrator()
    body = json_body(api.request)
    missing = [key for key in ("configure", "write", "read") if not isinstance(body.get(key), str)]
    if missing:
        raise bad_request(f"[{', '.join('{key_missing,' + key + '}' for key in missing)}]")
    access = api.context.access
    if not access.vhost_exists(vhost) or access.user(user) is None:
        raise not_found()
    created = access.permissions_of(user, vhost) is None
    d = _run(
        api, "set_permissions", user, body["configure"], body["write"], body["read"], vhost=vhost
    )
    return d.addCallback(lambda _: _answer(created))


def delete_permission(api, vhost, user):
    api.check_administrator()
    if api.context.access.permissions_of(user, vhost) is None:
        raise not_found()
    return _run(api, "clear_permissions", user, vhost=vhost).addCallback(lambda _: None)
