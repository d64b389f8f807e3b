"""Definitions: the broker's users, vhosts, permissions, policies and topology
in RabbitMQ's JSON format.

L{export_definitions} writes what RabbitMQ 3.10's management API writes for
C{GET /api/definitions}: C{rabbit_version}, C{rabbitmq_version},
C{product_name}, C{product_version}, C{users} (with C{password_hash},
C{hashing_algorithm}, C{tags} as a list, C{limits}), C{vhosts},
C{permissions}, C{topic_permissions}, C{parameters}, C{global_parameters},
C{policies}, C{queues} (every queue but exclusive ones), C{exchanges} (all
but the default and the C{amq.*} ones) and C{bindings} (those whose source
is a named exchange and whose destination is exported); for one vhost
(C{GET /api/definitions/{vhost}}) only C{rabbit_version}, C{parameters},
C{policies}, C{queues}, C{exchanges} and C{bindings}, without their
C{vhost} fields.

L{import_definitions} takes such a document (one RabbitMQ wrote, too),
checks all of it first and refuses a malformed one with one
L{DefinitionsRefused} naming the fault, having changed nothing; then, in
RabbitMQ's order, it creates or updates users (keeping their password
hashes, so they log in with their old passwords), vhosts, permissions and
policies in the access database, declares exchanges, queues (one that
exists is left as it is, as RabbitMQ does) and bindings (exchange-to-exchange
ones too) in the running broker, and hands each vhost its policies. Importing
the same document again changes nothing. Topic permissions are kept with the
permissions (L{brokerd.access.topic_permissions}); runtime parameters, global
parameters and users' limits are read and written by
L{brokerd.access.definition_parameters}.
"""

import datetime
import decimal
import json

from twisted.internet import defer

import brokerd
from brokerd.access import definition_parameters as parameter_sections
from brokerd.access import vhosts as vhost_changes
from brokerd.access.database import AccessChangeRefused
from brokerd.access.limits import publish_all_limits
from brokerd.access.passwords import HASHING_ALGORITHM, hash_password
from brokerd.access.policies import PolicyRefused, check_policy, publish_all_policies
from brokerd.access.topic_permissions import TopicPermission, checked_topic_permissions
from brokerd.errors import BrokerError
from brokerd.interfaces import IDelayedMessageStore
from brokerd.model.exchange import DELAYED_TYPE, EXCHANGE_TYPES, KNOWN_TYPES
from brokerd.model.queue_arguments import QueueArguments
from brokerd.model.queue_types import check_declaration
from brokerd.proto.tables import TimestampSeconds

RABBIT_VERSION = "3.10.8"  # the RabbitMQ release whose definitions format this follows
PRODUCT_NAME = "brokerd"
PARAMETER_SECTIONS = ("parameters", "global_parameters")


class DefinitionsRefused(ValueError):
    """A definitions document that cannot be imported; the message says what is wrong and where."""


# -- export


def export_definitions(broker, access, vhost=None):
    """
    The definitions of the whole broker, or with C{vhost} of that vhost alone,
    as a dict ready for JSON.
    """
    names = sorted(access.vhosts) if vhost is None else [vhost]
    queues, exchanges, bindings = [], [], []
    for name in names:
        served = broker.vhosts.get(name)
        if served is not None:
            _export_topology(served, queues, exchanges, bindings)
    policies = [_policy_entry(policy) for policy in access.policies(vhost)]
    if vhost is not None:
        for entry in (*queues, *exchanges, *bindings):
            del entry["vhost"]
        return {
            "rabbit_version": RABBIT_VERSION,
            "parameters": parameter_sections.exported_parameters(access, vhost),
            "policies": policies,
            "queues": queues, "exchanges": exchanges, "bindings": bindings,
        }
    return {
        "rabbit_version": RABBIT_VERSION,
        "rabbitmq_version": RABBIT_VERSION,
        "product_name": PRODUCT_NAME,
        "product_version": brokerd.__version__,
        "users": [
            {
                "name": user.name, "password_hash": user.password_hash or "",
                "hashing_algorithm": HASHING_ALGORITHM, "tags": list(user.tags),
                "limits": dict(user.limits),
            }
            for user in sorted(access.users.values(), key=_name)
        ],
        "vhosts": [{"name": name} for name in names],
        "permissions": [
            {
                "user": user, "vhost": on, "configure": permissions.configure,
                "write": permissions.write, "read": permissions.read,
            }
            for (user, on), permissions in sorted(access.permissions.items())
        ],
        "topic_permissions": access.topic_permissions.document(),
        "parameters": parameter_sections.exported_parameters(access),
        "global_parameters": parameter_sections.exported_global_parameters(access),
        "policies": policies,
        "queues": queues,
        "exchanges": exchanges,
        "bindings": bindings,
    }


def _name(thing):
    return thing.name


def _export_topology(vhost, queues, exchanges, bindings):
    exported_queues = set()
    for queue in sorted(vhost.queues.values(), key=_name):
        if queue.owner is None:  # an exclusive queue cannot be restored (as RabbitMQ)
            exported_queues.add(queue)
            queues.append({
                "name": queue.name, "vhost": vhost.name, "durable": queue.durable,
                "auto_delete": queue.auto_delete, "arguments": json_arguments(queue.arguments),
            })
    for exchange in sorted(vhost.exchanges.values(), key=_name):
        if exchange.name and not exchange.name.startswith("amq."):
            exchanges.append({
                "name": exchange.name, "vhost": vhost.name, "type": exchange.type_name,
                "durable": exchange.durable, "auto_delete": exchange.auto_delete,
                "internal": exchange.internal, "arguments": json_arguments(exchange.arguments),
            })
    found = []
    for exchange in vhost.exchanges.values():
        if not exchange.name:
            continue
        for binding in exchange.bindings.values():
            if binding.to_exchange or binding.destination in exported_queues:
                found.append({
                    "source": exchange.name, "vhost": vhost.name,
                    "destination": binding.destination.name,
                    "destination_type": "exchange" if binding.to_exchange else "queue",
                    "routing_key": binding.routing_key,
                    "arguments": json_arguments(binding.arguments),
                })
    bindings.extend(sorted(found, key=lambda entry: (
        entry["source"], entry["destination_type"], entry["destination"], entry["routing_key"],
        json.dumps(entry["arguments"], sort_keys=True),
    )))


def _policy_entry(policy):
    return {
        "vhost": policy.vhost, "name": policy.name, "pattern": policy.pattern,
        "apply-to": policy.apply_to, "definition": policy.definition, "priority": policy.priority,
    }


def json_arguments(value):
    """
    Field-table values as RabbitMQ's JSON writes them: text for bytes, seconds
    for a timestamp.
    """
    if isinstance(value, dict):
        return {key: json_arguments(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_arguments(item) for item in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    if isinstance(value, TimestampSeconds):
        return int(value.seconds)
    if isinstance(value, decimal.Decimal):
        return float(value)
    return value


# -- import


def parse_definitions(data):
    """
    The document in C{data} (JSON text or UTF-8 bytes); raises
    L{DefinitionsRefused} if it is not a JSON object.
    """
    try:
        document = json.loads(data)
    except ValueError as problem:  # UnicodeDecodeError is one too
        raise DefinitionsRefused(f"not valid JSON: {problem}") from None
    if not isinstance(document, dict):
        raise DefinitionsRefused("not a definitions document: a JSON object is expected at the top")
    return document


def import_definitions(broker, access, document, vhost=None):
    """
    Import C{document} (a dict) into the broker and its access database; with
    C{vhost}, its policies, exchanges, queues and bindings into that vhost
    alone. Returns a Deferred firing once everything is durable and declared,
    or failing with L{DefinitionsRefused} (for a malformed document, before
    anything changed).
    """
    checked = defer.maybeDeferred(_check, broker, access, document, vhost)
    return checked.addCallback(_apply, broker, access, vhost)


def _check(broker, access, document, vhost):
    """
    The document's sections, checked as a whole; raises L{DefinitionsRefused}
    for the first fault.
    """
    if not isinstance(document, dict):
        raise DefinitionsRefused("not a definitions document: a JSON object is expected at the top")
    sections = {}
    for section in ("users", "vhosts", "permissions", "policies", "queues", "exchanges", "bindings",
                    "topic_permissions", *PARAMETER_SECTIONS):
        entries = document.get(section, [])
        if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
            raise DefinitionsRefused(f"{section}: a list of JSON objects is expected")
        sections[section] = entries
    if vhost is not None:
        if not access.vhost_exists(vhost):
            raise DefinitionsRefused(
                f'Please create virtual host "{vhost}" prior to importing definitions.'
            )
        sections.update(
            users=[], vhosts=[], permissions=[], topic_permissions=[], global_parameters=[]
        )
        for section in ("policies", "queues", "exchanges", "bindings", "parameters"):
            sections[section] = [{**entry, "vhost": vhost} for entry in sections[section]]
    users = [_user(entry) for entry in sections["users"]]
    new_vhosts = []
    for entry in sections["vhosts"]:
        name = _text(entry, "name", "vhosts")
        _named("vhost", name)
        if not access.vhost_exists(name) and name not in new_vhosts:
            new_vhosts.append(name)
    known_vhosts = set(access.vhosts) | set(new_vhosts)
    known_users = set(access.users) | {user[0] for user in users}

    def in_vhost(entry, section):
        name = _text(entry, "vhost", section)
        if name not in known_vhosts:
            raise DefinitionsRefused(
                f"{section}: Virtual host '{name}' does not exist and is not in the definitions"
            )
        if name in broker.unavailable_vhosts:
            raise DefinitionsRefused(
                f"{section}: vhost '{name}' is down: {broker.unavailable_vhosts[name]}"
            )
        return name

    permissions = []
    for entry in sections["permissions"]:
        user, on = _text(entry, "user", "permissions"), in_vhost(entry, "permissions")
        if user not in known_users:
            raise DefinitionsRefused(f"permissions: User {user} does not exist")
        expressions = (_text(entry, kind, "permissions") for kind in ("configure", "write", "read"))
        permissions.append((user, on, *expressions))
    permissions += checked_topic_permissions(
        sections["topic_permissions"], known_users, in_vhost, DefinitionsRefused
    )
    policies = []
    for entry in sections["policies"]:
        on = in_vhost(entry, "policies")
        try:
            policies.append(check_policy(
                on, entry.get("name"), entry.get("pattern"), entry.get("definition"),
                entry.get("priority", 0), entry.get("apply-to", "all"),
            ))
        except PolicyRefused as refusal:
            raise DefinitionsRefused(f"policies: {refusal} ({on}/{entry.get('name')})") from None
    exchanges = []
    for entry in sections["exchanges"]:
        on = in_vhost(entry, "exchanges")
        name, type_name = _text(entry, "name", "exchanges"), entry.get("type")
        if type_name not in KNOWN_TYPES:
            raise DefinitionsRefused(
                f"exchanges: unknown exchange type '{type_name}' of exchange '{name}'"
                f" in vhost '{on}'"
            )
        if type_name == DELAYED_TYPE:
            _check_delayed(broker, on, name, entry.get("arguments") or {})
        exchanges.append((
            on, name, type_name, _flag(entry, "durable", True), _flag(entry, "auto_delete", False),
            _flag(entry, "internal", False), _arguments(entry, "exchanges"),
        ))
    queues = []
    for entry in sections["queues"]:
        on, name = in_vhost(entry, "queues"), _text(entry, "name", "queues")
        durable = _flag(entry, "durable", True)
        auto_delete = _flag(entry, "auto_delete", False)
        arguments = _arguments(entry, "queues")
        try:
            check_declaration(name, on, durable, False, auto_delete, arguments)
            QueueArguments(arguments, name, on)  # what declaring it would refuse
        except BrokerError as refusal:
            raise DefinitionsRefused(f"queues: {refusal.reply_text}") from None
        queues.append((on, name, durable, auto_delete, arguments))
    bindings = []
    exchange_types = {(on, name): type_name for on, name, type_name, *_ in exchanges}
    for entry in sections["bindings"]:
        on, source = in_vhost(entry, "bindings"), _text(entry, "source", "bindings")
        destination, kind = _text(entry, "destination", "bindings"), entry.get("destination_type")
        if kind not in ("queue", "exchange"):
            raise DefinitionsRefused(
                f"bindings: destination_type {kind!r} is not 'queue' or 'exchange'"
            )
        arguments = _arguments(entry, "bindings")
        type_name = exchange_types.get((on, source)) or _served_type(broker, on, source)
        if type_name in EXCHANGE_TYPES:
            try:
                EXCHANGE_TYPES[type_name].check_binding_arguments(arguments)
            except BrokerError as refusal:
                raise DefinitionsRefused(f"bindings: {refusal.reply_text}") from None
        routing_key = _text(entry, "routing_key", "bindings", "")
        bindings.append((on, source, destination, kind, routing_key, arguments))
    try:
        parameters = parameter_sections.checked_parameters(
            sections["parameters"], sections["global_parameters"], in_vhost
        )
        parameter_sections.check_queue_limits(broker, access, queues)
    except parameter_sections.ParametersRefused as refusal:
        raise DefinitionsRefused(str(refusal)) from None
    return users, new_vhosts, permissions, policies, exchanges, queues, bindings, parameters


def _user(entry):
    name = _text(entry, "name", "users")
    _named("user", name)
    tags = entry.get("tags", [])
    if isinstance(tags, str):  # RabbitMQ before 3.9 wrote them comma-separated
        tags = [tag.strip() for tag in tags.split(",") if tag.strip()]
    if not isinstance(tags, list) or not all(
        isinstance(tag, str) and tag and "," not in tag for tag in tags
    ):
        raise DefinitionsRefused(f"users: the tags of user '{name}' are not a list of words")
    if "password" in entry and "password_hash" in entry:
        raise DefinitionsRefused(
            f"users: both_password_and_password_hash_are_provided (user '{name}')"
        )
    try:
        limits = parameter_sections.user_limits(entry, name)
    except parameter_sections.ParametersRefused as refusal:
        raise DefinitionsRefused(str(refusal)) from None
    if "password" in entry:
        return name, hash_password(_text(entry, "password", "users")), tags, limits
    algorithm = entry.get("hashing_algorithm", HASHING_ALGORITHM)
    if algorithm != HASHING_ALGORITHM:
        raise DefinitionsRefused(f"users: user '{name}' has a password hash made by {algorithm!r};"
                                 f" only {HASHING_ALGORITHM} hashes can be checked here")
    return name, _text(entry, "password_hash", "users", "") or None, tags, limits


def _text(entry, key, section, default=None):
    value = entry.get(key, default)
    if not isinstance(value, str):
        raise DefinitionsRefused(
            f"{section}: {key!r} must be a string in {json.dumps(entry)[:200]}"
        )
    return value


def _flag(entry, key, default):
    value = entry.get(key, default)
    if not isinstance(value, bool):
        raise DefinitionsRefused(f"{key!r} must be true or false in {json.dumps(entry)[:200]}")
    return value


def _arguments(entry, section):
    arguments = entry.get("arguments") or {}
    if not isinstance(arguments, dict):
        raise DefinitionsRefused(
            f"{section}: arguments must be a JSON object in {json.dumps(entry)[:200]}"
        )
    return arguments


def _named(kind, name):
    if not name or len(name.encode()) > 255:
        raise DefinitionsRefused(
            f"{kind}s: a {kind} name must be 1 to 255 bytes of UTF-8, not {name!r}"
        )


def _check_delayed(broker, vhost_name, name, arguments):
    """
    What declaring an x-delayed-message exchange would refuse: an inner type
    that is none, a store without delays.
    """
    if arguments.get("x-delayed-type") not in EXCHANGE_TYPES:
        raise DefinitionsRefused(
            f"exchanges: invalid arg 'x-delayed-type' for exchange '{name}' in vhost"
            f" '{vhost_name}': {arguments.get('x-delayed-type')!r} is none of"
            f" {', '.join(EXCHANGE_TYPES)}"
        )
    vhost = broker.vhosts.get(vhost_name)
    store = vhost.store if vhost is not None else broker.store
    if not IDelayedMessageStore.providedBy(store):
        raise DefinitionsRefused(
            f"exchanges: the {store.name} store cannot keep delayed messages (exchange '{name}')"
        )


def _served_type(broker, vhost_name, exchange_name):
    vhost = broker.vhosts.get(vhost_name)
    exchange = vhost.exchanges.get(exchange_name) if vhost is not None else None
    return exchange.type_name if exchange is not None else None


@defer.inlineCallbacks
def _apply(checked, broker, access, vhost):
    users, new_vhosts, permissions, policies, exchanges, queues, bindings, parameters = checked
    try:
        for name, password_hash, tags, limits in users:
            access.set_password_hash(name, password_hash, tags, limits)
        for name in new_vhosts:
            yield defer.maybeDeferred(vhost_changes.add_vhost, broker, access, name)
        for user, on, *expressions in permissions:
            if isinstance(expressions[0], TopicPermission):  # a topic permission
                access.set_topic_permissions(user, on, *expressions[0].as_tuple())
            else:
                access.set_permissions(user, on, *expressions)
        for policy in policies:
            access.set_policy(*policy)
        parameter_sections.apply_parameters(access, *parameters)
    except AccessChangeRefused as refusal:
        raise DefinitionsRefused(str(refusal)) from None
    try:
        for on, name, type_name, durable, auto_delete, internal, arguments in exchanges:
            served = broker.vhost(on)
            # As RabbitMQ: one that exists is kept as it is.
            if name and not name.startswith("amq.") and name not in served.exchanges:
                served.declare_exchange(
                    name, type_name, durable=durable, auto_delete=auto_delete, internal=internal,
                    arguments=arguments,
                )
        for on, name, durable, auto_delete, arguments in queues:
            served = broker.vhost(on)
            if not name.startswith("amq.") and name not in served.queues:
                served.declare_queue(
                    name, durable=durable, auto_delete=auto_delete, arguments=arguments
                )
        for on, source, destination, kind, routing_key, arguments in bindings:
            served = broker.vhost(on)
            if kind == "queue":
                served.bind(destination, source, routing_key, arguments)
            else:
                served.bind_exchange(destination, source, routing_key, arguments)
    except BrokerError as refusal:
        raise DefinitionsRefused(f"{refusal.reply_code} {refusal.reply_text}") from None
    finally:
        publish_all_policies(broker, access)
        publish_all_limits(broker, access)
    return None


def load_definitions_file(broker, access, path):
    """
    Import the definitions file at C{path} (C{--load-definitions}); a Deferred,
    failing with DefinitionsRefused.
    """
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as problem:
        return defer.fail(DefinitionsRefused(f"cannot read {path!r}: {problem.strerror}"))
    try:
        document = parse_definitions(data)
    except DefinitionsRefused as refusal:
        return defer.fail(refusal)
    return import_definitions(broker, access, document)
