"""Managing users, vhosts and permissions, free of any wire protocol.

L{AccessCommands} carries out rabbitmqctl's commands (C{add_user}, C{list_vhosts},
C{set_permissions}, C{set_policy} and the others, in its argument order) for
a logged-in user with the C{administrator} tag (the policy commands also for
a C{policymaker} with access to the vhost, as RabbitMQ's management API
allows; C{list_policies} for any management user with access to it), and
exports and imports definitions (L{brokerd.access.definitions}) for an
administrator, on the broker's access database and its
running broker together, so that every protocol's management front end (the
native protocol's today, an HTTP API later) checks and does the same. A change
is durable (written and fsynced by the access database, and for a vhost served
or dropped by the broker) before the Deferred it returns fires, and logged
(in the words of RabbitMQ's log, with the user who made it; never a password).

Refusals are L{brokerd.errors} errors in RabbitMQ's words: 403 ACCESS_REFUSED
for a user who is not an administrator, 404 NOT_FOUND for an unknown user or
vhost, 406 PRECONDITION_FAILED for a change that cannot be made. Listings are
L{Table}s of text as C{rabbitmqctl --quiet} prints them, sorted by name.
"""

import json
import re

from twisted.internet import defer
from zope.interface import implementer

from brokerd.access import topic_commands, tracing_commands, vhosts
from brokerd.access.command_results import DONE, Table
from brokerd.access.command_results import done as _done
from brokerd.access.database import DEFAULT_VHOST, AccessChangeRefused
from brokerd.access.definitions import (
    DefinitionsRefused,
    export_definitions,
    import_definitions,
    parse_definitions,
)
from brokerd.access.interfaces import IAccessCommands
from brokerd.access.policies import (
    PolicyRefused,
    parse_definition,
    parse_priority,
    publish_policies,
)
from brokerd.errors import (
    AccessRefused,
    InternalError,
    MethodNotImplemented,
    NotFound,
    PreconditionFailed,
)
from brokerd.storage.registry import BackendError

ADMINISTRATOR = "administrator"
NOT_ADMINISTRATOR = "Not administrator user"  # RabbitMQ's management API's words (rabbit_mgmt_util)
POLICYMAKER = "policymaker"
MANAGEMENT_TAGS = ("administrator", "monitoring", "policymaker", "management")
# rabbit_mgmt_util:is_authorized_policies
NOT_AUTHORISED_OBJECT = "User not authorised to access object"
# rabbit_mgmt_util:is_authorized_vhost
NOT_AUTHORISED_VHOST = "User not authorised to access virtual host"


def format_tags(tags):
    """A user's tags as rabbitmqctl lists them: C{[administrator, monitoring]}."""
    return f"[{', '.join(tags)}]"


@implementer(IAccessCommands)
class AccessCommands:
    """
    The management commands over one broker and its access database.

    Every command takes the name of the user who asks first (None: nobody
    logged in) and refuses unless that user exists now with the
    C{administrator} tag, so a user whose tag is taken away loses the
    right at once, whenever it logged in. A listing or a user or permission
    change returns its L{Table}; C{add_vhost} and C{delete_vhost}, which
    the broker may carry out later, return a Deferred of it; L{run} always
    returns a Deferred.
    """

    def __init__(self, broker, access):
        """
        @param broker: the running L{brokerd.model.broker.Broker}.
        @param access: its L{brokerd.access.interfaces.IAccessDatabase}.
        """
        self.broker = broker
        self.access = access

    def run(self, user, command, arguments=(), vhost=DEFAULT_VHOST, backend=None):
        """
        Carry out rabbitmqctl's C{command} with its positional C{arguments}
        (C{vhost} for the permission commands, C{backend} for C{add_vhost});
        returns a Deferred firing with a L{Table} once done and durable.
        """
        return defer.maybeDeferred(
            self._run, user, command, tuple(arguments), vhost or DEFAULT_VHOST, backend
        )

    def _run(self, user, command, arguments, vhost, backend):
        spec = COMMANDS.get(command)
        if spec is None:
            raise MethodNotImplemented(f"unknown management command {command!r}")
        method, fewest, most, usage = spec
        if len(arguments) < fewest or (most is not None and len(arguments) > most):
            raise PreconditionFailed(f"{command} takes {usage}, got {len(arguments)} argument(s)")
        if command == "add_vhost":
            return self.add_vhost(user, *arguments, backend=backend)
        if command in PER_VHOST:
            return method(self, user, vhost, *arguments)
        return method(self, user, *arguments)

    # -- the check every command makes

    def check_administrator(self, user):
        """Raise 403 ACCESS_REFUSED unless C{user} exists with the administrator tag."""
        record = self.access.user(user) if user is not None else None
        if record is None or ADMINISTRATOR not in record.tags:
            raise AccessRefused(
                NOT_ADMINISTRATOR if user is not None
                else f"{NOT_ADMINISTRATOR} (no user logged in)"
            )

    # -- vhosts

    def add_vhost(self, user, name, backend=None):
        """
        Create and serve vhost C{name}; one that exists is left as it is (as
        rabbitmqctl does).
        """
        self.check_administrator(user)
        if self.access.vhost_exists(name):
            return DONE
        extra = {"backend": backend} if backend else {}
        d = defer.maybeDeferred(
            self._changed, vhosts.add_vhost, self.broker, self.access, name, **extra
        )
        return d.addCallback(lambda _: _done(user, "Added vhost '{name}'", name=name))

    def delete_vhost(self, user, name):
        """Delete vhost C{name} with its queues, messages and permissions; its clients get 320."""
        self.check_administrator(user)
        self._existing_vhost(name, f"Virtual host '{name}' does not exist")
        d = defer.maybeDeferred(self._changed, vhosts.delete_vhost, self.broker, self.access, name)
        return d.addCallback(lambda _: _done(user, "Deleted vhost '{name}'", name=name))

    def list_vhosts(self, user):
        self.check_administrator(user)
        return Table(("name",), [(name,) for name in sorted(self.access.vhosts)])

    # -- users

    def add_user(self, user, name, password):
        """Create a user without tags or permissions (RabbitMQ's C{add_user})."""
        self.check_administrator(user)
        if not name:
            raise PreconditionFailed("user cannot be an empty string")
        if self.access.user(name) is not None:
            raise PreconditionFailed(f'User "{name}" already exists')
        self._changed(self.access.add_user, name, password)
        return _done(user, "Created user '{name}'", name=name)

    def delete_user(self, user, name):
        """Delete a user with its permissions on every vhost."""
        self.check_administrator(user)
        self._existing_user(name, f'User "{name}" does not exist')
        self._changed(self.access.delete_user, name)
        return _done(user, "Deleted user '{name}'", name=name)

    def change_password(self, user, name, password):
        self.check_administrator(user)
        self._existing_user(name, f'User "{name}" does not exist')
        self._changed(self.access.set_password, name, password)
        return _done(user, "Changed password for user '{name}'", name=name)

    def set_user_tags(self, user, name, *tags):
        """Replace a user's tags (none: it has no tags)."""
        self.check_administrator(user)
        self._existing_user(name, f'User "{name}" does not exist')
        self._changed(self.access.set_user_tags, name, tags)
        return _done(
            user, "Set user tags for user '{name}' to {tags}", name=name, tags=format_tags(tags)
        )

    def list_users(self, user):
        self.check_administrator(user)
        return Table(("user", "tags"), [(name, format_tags(self.access.users[name].tags))
                                        for name in sorted(self.access.users)])

    # -- permissions

    def set_permissions(self, user, vhost, name, configure, write, read):
        """Give user C{name} the three expressions on C{vhost} (RabbitMQ's C{set_permissions})."""
        self.check_administrator(user)
        for expression in (configure, write, read):
            try:
                re.compile(expression)
            except re.error:
                raise PreconditionFailed(f"regular expression '{expression}' is invalid") from None
        self._existing_vhost(vhost, f"Virtual host {vhost} does not exist")
        self._existing_user(name, f"User {name} does not exist")
        self._changed(self.access.set_permissions, name, vhost, configure, write, read)
        return _done(
            user,
            "Set permissions for user '{name}' in vhost '{vhost}'"
            " to '{configure}', '{write}', '{read}'",
            name=name, vhost=vhost, configure=configure, write=write, read=read,
        )

    def clear_permissions(self, user, vhost, name):
        """Take every permission on C{vhost} from user C{name}; one without any is no error."""
        self.check_administrator(user)
        self._existing_vhost(vhost, f"Virtual host {vhost} does not exist")
        self._existing_user(name, f"User {name} does not exist")
        self._changed(self.access.clear_permissions, name, vhost)
        return _done(
            user, "Cleared permissions for user '{name}' in vhost '{vhost}'",
            name=name, vhost=vhost,
        )

    def list_permissions(self, user, vhost):
        self.check_administrator(user)
        self._existing_vhost(vhost, f"Virtual host '{vhost}' does not exist")
        rows = [
            (name, *permissions.as_tuple())
            for (name, on), permissions in sorted(self.access.permissions.items())
            if on == vhost
        ]
        return Table(("user", "configure", "write", "read"), rows)

    # -- policies

    def check_policymaker(self, user, vhost):
        """
        Raise 403 unless C{user} is an administrator, or a policymaker with
        permissions on C{vhost}.
        """
        record = self.access.user(user) if user is not None else None
        if record is not None and (
            ADMINISTRATOR in record.tags
            or (POLICYMAKER in record.tags and self.access.permissions_of(user, vhost) is not None)
        ):
            return
        raise AccessRefused(NOT_AUTHORISED_OBJECT)

    def set_policy(self, user, vhost, name, pattern, definition, priority="0", apply_to="all"):
        """
        Create or replace a policy (rabbitmqctl's C{set_policy}: C{definition}
        is JSON text) and apply it.
        """
        self.check_policymaker(user, vhost)
        self._existing_vhost(vhost, f"Virtual host '{vhost}' does not exist")
        try:
            priority, definition = parse_priority(priority), parse_definition(definition)
        except PolicyRefused as refusal:
            raise PreconditionFailed(str(refusal)) from None
        self._changed(self.access.set_policy, vhost, name, pattern, definition, priority, apply_to)
        publish_policies(self.broker, self.access, vhost)
        return _done(
            user,
            "Set policy '{name}' matching {apply_to} names in virtual host '{vhost}'"
            " using pattern '{pattern}'",
            name=name, apply_to=apply_to, vhost=vhost, pattern=pattern,
        )

    def clear_policy(self, user, vhost, name):
        """Delete a policy (rabbitmqctl's C{clear_policy}); one that does not exist is 404."""
        self.check_policymaker(user, vhost)
        self._existing_vhost(vhost, f"Virtual host '{vhost}' does not exist")
        if all(policy.name != name for policy in self.access.policies(vhost)):
            raise NotFound("Parameter does not exist")
        self._changed(self.access.clear_policy, vhost, name)
        publish_policies(self.broker, self.access, vhost)
        return _done(
            user, "Cleared policy '{name}' in virtual host '{vhost}'", name=name, vhost=vhost
        )

    def list_policies(self, user, vhost):
        """
        The policies of C{vhost} as C{rabbitmqctl list_policies} prints them
        (definition as JSON).
        """
        record = self.access.user(user) if user is not None else None
        if record is None or not (
            ADMINISTRATOR in record.tags
            or (
                set(record.tags) & set(MANAGEMENT_TAGS)
                and self.access.permissions_of(user, vhost) is not None
            )
        ):
            raise AccessRefused(NOT_AUTHORISED_VHOST)
        self._existing_vhost(vhost, f"Virtual host '{vhost}' does not exist")
        rows = [
            (
                policy.vhost, policy.name, policy.pattern, policy.apply_to,
                json.dumps(policy.definition, separators=(",", ":"), sort_keys=True),
                str(policy.priority),
            )
            for policy in self.access.policies(vhost)
        ]
        return Table(("vhost", "name", "pattern", "apply-to", "definition", "priority"), rows)

    # -- definitions

    def export_definitions(self, user):
        """
        The broker's definitions (L{brokerd.access.definitions}) as one row of
        one column: the JSON text.
        """
        self.check_administrator(user)
        text = json.dumps(export_definitions(self.broker, self.access), ensure_ascii=False)
        return Table(("definitions",), [(text,)])

    def import_definitions(self, user, text):
        """
        Import definitions given as JSON text; a malformed document is 406,
        naming the fault, and changes nothing.
        """
        self.check_administrator(user)
        d = defer.maybeDeferred(parse_definitions, text)
        d.addCallback(lambda document: import_definitions(self.broker, self.access, document))

        def refused(failure):
            failure.trap(DefinitionsRefused)
            raise PreconditionFailed(str(failure.value))

        d.addErrback(refused)
        return d.addCallback(lambda _: _done(user, "Imported definitions"))

    # -- helpers

    def _existing_user(self, name, complaint):
        if self.access.user(name) is None:
            raise NotFound(complaint)

    def _existing_vhost(self, name, complaint):
        if not self.access.vhost_exists(name):
            raise NotFound(complaint)

    @staticmethod
    def _changed(change, *args, **kwargs):
        """
        Make a change (which may return a Deferred): what the database refuses,
        or a vhost's backend string it cannot use, is 406 in its words; one that
        cannot be written is 541.
        """
        try:
            result = change(*args, **kwargs)
        except (AccessChangeRefused, BackendError, OSError) as problem:
            raise _refusal(problem) from None
        if isinstance(result, defer.Deferred):
            result.addErrback(_refused_later)
        return result


def _refusal(problem):
    if isinstance(problem, OSError):
        return InternalError(f"the change could not be saved: {problem}")
    return PreconditionFailed(str(problem))


def _refused_later(failure):
    failure.trap(AccessChangeRefused, BackendError, OSError)
    raise _refusal(failure.value)


PER_VHOST = (
    "set_permissions", "clear_permissions", "list_permissions", "set_policy", "clear_policy",
    "list_policies",
)
PER_VHOST += (
    "set_topic_permissions", "clear_topic_permissions", "list_topic_permissions", "trace_on",
    "trace_off",
)

# command -> (method, fewest and most positional arguments (None: any number), what they are)
COMMANDS = {
    "add_vhost": (AccessCommands.add_vhost, 1, 1, "NAME"),
    "delete_vhost": (AccessCommands.delete_vhost, 1, 1, "NAME"),
    "list_vhosts": (AccessCommands.list_vhosts, 0, 0, "no arguments"),
    "add_user": (AccessCommands.add_user, 2, 2, "NAME PASSWORD"),
    "delete_user": (AccessCommands.delete_user, 1, 1, "NAME"),
    "change_password": (AccessCommands.change_password, 2, 2, "NAME PASSWORD"),
    "list_users": (AccessCommands.list_users, 0, 0, "no arguments"),
    "set_user_tags": (AccessCommands.set_user_tags, 1, None, "NAME [TAG...]"),
    "set_permissions": (AccessCommands.set_permissions, 4, 4, "USER CONFIGURE WRITE READ"),
    "clear_permissions": (AccessCommands.clear_permissions, 1, 1, "USER"),
    "list_permissions": (AccessCommands.list_permissions, 0, 0, "no arguments"),
    "set_policy": (
        AccessCommands.set_policy, 3, 5, "NAME PATTERN DEFINITION [PRIORITY [APPLY_TO]]"
    ),
    "clear_policy": (AccessCommands.clear_policy, 1, 1, "NAME"),
    "list_policies": (AccessCommands.list_policies, 0, 0, "no arguments"),
    "export_definitions": (AccessCommands.export_definitions, 0, 0, "no arguments"),
    "import_definitions": (AccessCommands.import_definitions, 1, 1, "DEFINITIONS_JSON"),
}
COMMANDS.update(topic_commands.COMMANDS)
COMMANDS.update(tracing_commands.COMMANDS)
