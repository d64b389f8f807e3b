"""Runtime parameters, global parameters and limits over HTTP, in RabbitMQ 3.10's shapes.

C{/api/parameters[/{component}[/{vhost}[/{name}]]]} lists, reads, sets
(C{{"value": ...}}: 201 when new, 204 when replaced) and deletes runtime
parameters; C{/api/global-parameters[/{name}]} the same for global ones;
C{/api/vhost-limits[/{vhost}]} lists C{{"vhost", "value"}} and
C{/api/vhost-limits/{vhost}/{name}} sets or clears one limit (204);
C{/api/user-limits[/{user}]} and C{/api/user-limits/{user}/{name}} the same
for users. Refusals carry RabbitMQ's statuses and texts, the C{/api/parameters}
ones HTML-escaped as RabbitMQ's are. Runtime parameters are for
administrators and policymakers with access to the vhost, global parameters
and changes of limits for administrators; as RabbitMQ 3.10, every management
user may read the limits of the vhosts it sees and of every user. Limits are
listed by name, as RabbitMQ lists them; every change is durable before the
answer and logged.
"""

from html import escape

from twisted.logger import Logger

from brokerd.access.database import AccessChangeRefused
from brokerd.access.limits import publish_limits
from brokerd.access.parameters import (
    LIMITS,
    VHOST_LIMITS,
    ParameterRefused,
    check_parameter,
    check_user_limits,
)
from brokerd.errors import BrokerError
from brokerd.http.routes import ApiError, Created, bad_request, broker_error, json_body, not_found

log = Logger()

POLICY = "policy"  # RabbitMQ's component of policies, which have an API of their own
VALUE_MISSING = "[{key_missing,value}]"  # RabbitMQ's words for a body without a value


def _value(api):
    body = json_body(api.request)
    if "value" not in body:
        raise bad_request(VALUE_MISSING)
    return body["value"]


def _saved(change, *arguments):
    """Make a database change; a refusal is 400 in its words, a failed write 500."""
    try:
        change(*arguments)
    except AccessChangeRefused as refusal:
        raise bad_request(str(refusal)) from None
    except OSError as problem:
        raise ApiError(500, "internal_error", f"the change could not be saved: {problem}") from None


def _check_policymaker(api, vhost):
    try:
        api.context.management.check_policymaker(api.user, vhost)
    except BrokerError as refusal:
        raise broker_error(refusal) from None


def _vhost_for_change(api, vhost):
    if not api.context.access.vhost_exists(vhost):
        raise ApiError(404, "not_found", "vhost_not_found")
    return vhost


# -- runtime parameters

def list_parameters(api, component=None, vhost=None):
    if vhost is not None:
        names = [api.vhost_named(vhost)]
    else:
        names = [name for name in api.visible_vhosts() if _may_change(api, name)]
    runtime = api.context.access.runtime
    return [entry for name in names for entry in runtime.listed(name, component)]


def _may_change(api, vhost):
    try:
        api.context.management.check_policymaker(api.user, vhost)
    except BrokerError:
        return False
    return True


def get_parameter(api, component, vhost, name):
    api.vhost_named(vhost)
    _check_policymaker(api, vhost)
    for entry in api.context.access.runtime.listed(vhost, component):
        if entry["name"] == name:
            return entry
    raise not_found()


def put_parameter(api, component, vhost, name):
    _vhost_for_change(api, vhost)
    _check_policymaker(api, vhost)
    value = _value(api)
    if component == POLICY:
        raise bad_request("policies may not be set using this method")
    try:
        value = check_parameter(component, name, value)
    except ParameterRefused as refusal:
        raise bad_request(escape(str(refusal), quote=False)) from None
    access = api.context.access
    created = (vhost, component, name) not in access.runtime.parameters
    _saved(access.set_parameter, vhost, component, name, value)
    _changed(api, vhost, component)
    log.info(
        "Set runtime parameter '{name}' for component '{component}' in vhost '{vhost}'"
        " (by user '{acting_user}')",
        name=name, component=component, vhost=vhost, acting_user=api.user,
    )
    return Created() if created else None


def delete_parameter(api, component, vhost, name):
    api.vhost_named(vhost)
    _check_policymaker(api, vhost)
    access = api.context.access
    if (vhost, component, name) not in access.runtime.parameters:
        raise not_found()
    _saved(access.clear_parameter, vhost, component, name)
    _changed(api, vhost, component)
    log.info(
        "Cleared runtime parameter '{name}' for component '{component}' in vhost '{vhost}'"
        " (by user '{acting_user}')",
        name=name, component=component, vhost=vhost, acting_user=api.user,
    )


def _changed(api, vhost, component):
    if component == VHOST_LIMITS:
        publish_limits(api.context.broker, api.context.access, vhost)


# -- global parameters

def global_entry(name, value):
    return {"name": name, "value": value}


def list_global_parameters(api):
    api.check_administrator()
    return [
        global_entry(name, value)
        for name, value in sorted(api.context.access.runtime.global_parameters.items())
    ]


def get_global_parameter(api, name):
    api.check_administrator()
    parameters = api.context.access.runtime.global_parameters
    if name not in parameters:
        raise not_found()
    return global_entry(name, parameters[name])


def put_global_parameter(api, name):
    api.check_administrator()
    value = _value(api)
    access = api.context.access
    created = name not in access.runtime.global_parameters
    _saved(access.set_global_parameter, name, value)
    log.info(
        "Set global runtime parameter '{name}' (by user '{acting_user}')",
        name=name, acting_user=api.user,
    )
    return Created() if created else None


def delete_global_parameter(api, name):
    api.check_administrator()
    access = api.context.access
    if name not in access.runtime.global_parameters:
        raise not_found()
    _saved(access.clear_global_parameter, name)
    log.info(
        "Cleared global runtime parameter '{name}' (by user '{acting_user}')",
        name=name, acting_user=api.user,
    )


# -- vhost limits

def list_vhost_limits(api, vhost=None):
    names = [api.vhost_named(vhost)] if vhost is not None else api.visible_vhosts()
    runtime = api.context.access.runtime
    return [
        {"vhost": name, "value": _by_name(runtime.vhost_limits(name))}
        for name in names if runtime.vhost_limits(name)
    ]


def _by_name(limits):
    return dict(sorted(limits.items()))


def put_vhost_limit(api, vhost, name):
    api.check_administrator()
    value = _value(api)
    _vhost_for_change(api, vhost)
    limits = {**api.context.access.runtime.vhost_limits(vhost), name: value}
    try:
        check_parameter(VHOST_LIMITS, LIMITS, limits)
    except ParameterRefused as refusal:
        raise bad_request(str(refusal)) from None
    _set_vhost_limits(api, vhost, limits)


def delete_vhost_limit(api, vhost, name):
    api.check_administrator()
    _vhost_for_change(api, vhost)
    limits = dict(api.context.access.runtime.vhost_limits(vhost))
    if limits.pop(name, None) is not None:
        _set_vhost_limits(api, vhost, limits)


def _set_vhost_limits(api, vhost, limits):
    """Keep C{limits} as the vhost's (none: the parameter goes) and apply them at once."""
    access = api.context.access
    if limits:
        _saved(access.set_parameter, vhost, VHOST_LIMITS, LIMITS, limits)
    elif (vhost, VHOST_LIMITS, LIMITS) in access.runtime.parameters:
        _saved(access.clear_parameter, vhost, VHOST_LIMITS, LIMITS)
    publish_limits(api.context.broker, access, vhost)
    log.info(
        "Limits of vhost '{vhost}' set to {limits} (by user '{acting_user}')",
        vhost=vhost, limits=limits, acting_user=api.user,
    )


# -- user limits

def list_user_limits(api, user=None):
    access = api.context.access
    if user is not None and access.user(user) is None:
        raise not_found()
    names = [user] if user is not None else sorted(access.users)
    return [
        {"user": name, "value": _by_name(access.users[name].limits)}
        for name in names if access.users[name].limits
    ]


def put_user_limit(api, user, name):
    api.check_administrator()
    value = _value(api)
    record = _user_for_change(api, user)
    try:
        limits = check_user_limits({**record.limits, name: value})
    except ParameterRefused as refusal:
        raise bad_request(str(refusal)) from None
    _set_user_limits(api, user, limits)


def delete_user_limit(api, user, name):
    api.check_administrator()
    limits = dict(_user_for_change(api, user).limits)
    if limits.pop(name, None) is not None:
        _set_user_limits(api, user, limits)


def _user_for_change(api, user):
    record = api.context.access.user(user)
    if record is None:
        raise ApiError(400, "bad_request", ["no_such_user", user])
    return record


def _set_user_limits(api, user, limits):
    _saved(api.context.access.set_user_limits, user, limits)
    log.info(
        "Limits of user '{user}' set to {limits} (by user '{acting_user}')",
        user=user, limits=limits, acting_user=api.user,
    )
