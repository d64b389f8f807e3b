"""C{/api/definitions} and C{/api/policies}: RabbitMQ's definitions and policies over HTTP.

Export and import are L{brokerd.access.definitions}' (an administrator's, as in
RabbitMQ); policies go through L{brokerd.access.commands.AccessCommands}, so
the same checks, durability and log lines apply as to the command line's
C{set-policy}, and the vhost applies them at once.
"""

import json

from brokerd.access.definitions import (
    DefinitionsRefused,
    export_definitions,
    import_definitions,
    parse_definitions,
)
from brokerd.http.routes import ApiError, Created, bad_request, json_body, not_found

# -- definitions

def get_definitions(api, vhost=None):
    api.check_administrator()
    if vhost is not None:
        api.vhost_named(vhost)
    return export_definitions(api.context.broker, api.context.access, vhost)


def post_definitions(api, vhost=None):
    """
    Import the JSON body (as C{rabbitmqadmin import} and the management UI post
    it); 204 once done.
    """
    api.check_administrator()
    if vhost is not None:
        api.vhost_named(vhost)
    raw = api.request.content.read() if api.request.content is not None else b""
    try:
        document = parse_definitions(raw)
    except DefinitionsRefused as problem:
        raise ApiError(400, "bad_request", f"failed_to_parse_json: {problem}") from None
    d = import_definitions(api.context.broker, api.context.access, document, vhost)

    def refused(failure):
        failure.trap(DefinitionsRefused)
        raise bad_request(str(failure.value))

    return d.addCallbacks(lambda _: None, refused)


# -- policies

def policy_info(policy):
    return {
        "vhost": policy.vhost, "name": policy.name, "pattern": policy.pattern,
        "apply-to": policy.apply_to, "definition": policy.definition, "priority": policy.priority,
    }


def list_policies(api, vhost=None):
    names = [api.vhost_named(vhost)] if vhost is not None else api.visible_vhosts()
    access = api.context.access
    return [policy_info(policy) for name in names for policy in access.policies(name)]


def get_policy(api, vhost, name):
    for policy in api.context.access.policies(api.vhost_named(vhost)):
        if policy.name == name:
            return policy_info(policy)
    raise not_found()


def put_policy(api, vhost, name):
    """
    Create or replace a policy from RabbitMQ's body: pattern, definition,
    priority and apply-to.
    """
    api.vhost_named(vhost)
    body = json_body(api.request)
    if "pattern" not in body or "definition" not in body:
        raise bad_request("a policy needs a pattern and a definition")
    priority = body.get("priority", 0)
    created = all(policy.name != name for policy in api.context.access.policies(vhost))
    arguments = (
        name, body["pattern"], json.dumps(body["definition"]), str(priority),
        body.get("apply-to", "all"),
    )
    d = api.context.management.run(api.user, "set_policy", arguments, vhost=vhost)
    return d.addCallback(lambda _: Created() if created else None)


def delete_policy(api, vhost, name):
    api.vhost_named(vhost)
    d = api.context.management.run(api.user, "clear_policy", (name,), vhost=vhost)
    return d.addCallback(lambda _: None)

