"""The access database: users, virtual hosts and permissions, kept durably.

One JSON document in the broker's data directory (L{ACCESS_FILE}), apart from
whatever message store the broker runs on, in the shape of RabbitMQ's
definitions (C{users} with C{password_hash}, C{hashing_algorithm} and
C{tags}; C{vhosts}; C{permissions} with C{configure}, C{write}, C{read};
C{policies} with C{vhost}, C{name}, C{pattern}, C{apply-to}, C{definition},
C{priority}: a file written before policies were kept has none;
C{topic_permissions} with C{user}, C{vhost}, C{exchange}, C{write}, C{read}:
none in a file written before they were kept), runtime C{parameters} and
C{global_parameters} in RabbitMQ's shapes, and each user's C{limits}
(L{brokerd.access.parameters}).
A vhost made with a store of its own records its backend string in its
entry (C{"backend"}); an entry without one is on the broker's C{--backend}
store, as every vhost of a database written before that field was.
Every change is written to a temporary file, fsynced, renamed over the old
one and the directory fsynced before the change call returns, so a change
that was acknowledged survives a crash; a change that cannot be written is
undone in memory and raises.

The first start creates the vhost C{/} and one administrator (guest/guest
unless the operator names another) with every permission on C{/}.
Failed logins are counted per user name, in memory, for metrics.
"""

import json
import os
import re

from zope.interface import implementer

from brokerd.access.interfaces import IAccessDatabase
from brokerd.access.document_file import write_durably
from brokerd.access.passwords import HASHING_ALGORITHM, hash_password, password_matches
from brokerd.access.parameters import ParameterRefused, RuntimeParameters, check_parameter
from brokerd.access.policies import PolicyRefused, check_policy
from brokerd.access.records import (  # noqa: F401 (re-exported: the database's own names)
    DEFAULT_PASS,
    DEFAULT_USER,
    DEFAULT_VHOST,
    FULL_PERMISSIONS,
    USER_TAGS,
    AccessChangeRefused,
    Permissions,
    User,
    check_name,
    checked_tags,
    checked_user_limits,
)
from brokerd.access.topic_permissions import (
    TopicPermission,
    TopicPermissions,
    invalid_expression,
)
from brokerd.model.policy_effects import Policy

ACCESS_FILE = "access.json"
FORMAT = "brokerd access database"
FORMAT_VERSION = 1
class AccessDatabaseDamaged(Exception):
    """The access database file cannot be read; the message names the file and the fault."""


@implementer(IAccessDatabase)
class AccessDatabase:
    """
    Users, vhosts and permissions, loaded by L{open} and saved on every change.

    @ivar path: the file it is kept in, or None for one held in memory only.
    @ivar users: user name -> L{User}.
    @ivar vhosts: the names of the vhosts, in the order they were created.
    @ivar vhost_backends: vhost name -> the backend string of its own store,
        for the vhosts that have one.
    @ivar permissions: C{(user name, vhost name)} -> L{Permissions}.
    @ivar policy_records: C{(vhost name, policy name)} -> L{Policy}.
    @ivar topic_permissions: the L{TopicPermissions} of every user on every vhost.
    @ivar failed_logins: user name -> how many logins as that user were refused since start.
    @ivar runtime: the L{RuntimeParameters}: runtime and global parameters.
    """

    def __init__(self, path=None):
        self.path = path
        self.users = {}
        self.vhosts = []
        self.vhost_backends = {}
        self.permissions = {}
        self.policy_records = {}
        self.topic_permissions = TopicPermissions()
        self.failed_logins = {}
        self.runtime = RuntimeParameters()
        # Called with the document's bytes after each durable save (a cluster's leader
        # streams them to its followers).
        self.on_saved = []

    @classmethod
    def in_memory(cls, default_user=DEFAULT_USER, default_pass=DEFAULT_PASS):
        """A database kept in memory only, as a first start makes it."""
        database = cls(None)
        database.open(default_user, default_pass)
        return database

    @classmethod
    def in_directory(cls, data_dir):
        """The database kept in C{data_dir} (not read until L{open})."""
        return cls(os.path.join(data_dir, ACCESS_FILE))

    def open(self, default_user=DEFAULT_USER, default_pass=DEFAULT_PASS):
        """
        Load the database; on the first start (no file yet) create the vhost
        C{/} and C{default_user} (an administrator with every permission on
        C{/}) unless C{default_user} is None, and save. Returns True on a
        first start. Raises L{AccessDatabaseDamaged} for a file it cannot read.
        """
        if self.path is not None and os.path.exists(self.path):
            try:
                with open(self.path, "rb") as file:
                    self._take_document(json.loads(file.read().decode("utf-8")))
            except (OSError, ValueError, KeyError, TypeError) as problem:
                raise AccessDatabaseDamaged(
                    f"access database {self.path} cannot be read: {problem}"
                ) from None
            return False
        self.vhosts = [DEFAULT_VHOST]
        if default_user is not None:
            self.users[default_user] = User(
                default_user, hash_password(default_pass), ("administrator",)
            )
            self.permissions[(default_user, DEFAULT_VHOST)] = Permissions(*FULL_PERMISSIONS)
        if self.path is not None:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            self._save()
        return True

    # -- reading

    def user(self, name):
        """The L{User} called C{name}, or None."""
        return self.users.get(name)

    def check_password(self, name, password):
        """Whether user C{name} exists and C{password} (str or UTF-8 bytes) is its password."""
        user = self.users.get(name)
        return (
            user is not None
            and user.password_hash is not None
            and password_matches(user.password_hash, password)
        )

    def count_failed_login(self, name):
        """A login as C{name} was refused: count it."""
        self.failed_logins[name] = self.failed_logins.get(name, 0) + 1

    def vhost_exists(self, name):
        return name in self.vhosts

    def permissions_of(self, user, vhost):
        """The L{Permissions} of C{user} on C{vhost}, or None: it may not use that vhost."""
        return self.permissions.get((user, vhost))

    def policies(self, vhost=None):
        """
        The L{Policy} records of C{vhost} (None: of every vhost), by vhost,
        highest priority first, then name.
        """
        found = [
            policy for (on, _), policy in self.policy_records.items()
            if vhost is None or on == vhost
        ]
        return sorted(found, key=lambda policy: (policy.vhost, -policy.priority, policy.name))

    def topic_rules(self, user, vhost):
        """
        C{user}'s compiled topic permissions on C{vhost}, a dict kept up to date
        (L{TopicPermissions.rules}).
        """
        return self.topic_permissions.rules(user, vhost)

    # -- changes, each durable before it returns

    def add_user(self, name, password, tags=()):
        """Create a user (RabbitMQ's C{add_user}); it has no permissions until given some."""
        check_name("user", name)
        if name in self.users:
            raise AccessChangeRefused(f"user '{name}' already exists")
        user = User(name, hash_password(password), checked_tags(tags))
        self._change(lambda: self.users.__setitem__(name, user))

    def set_password(self, name, password):
        user = self._existing_user(name)
        self._change(lambda: setattr(user, "password_hash", hash_password(password)))

    def set_password_hash(self, name, password_hash, tags=(), limits=None):
        """
        Create or update a user from a hash made elsewhere (RabbitMQ's
        definitions); without C{limits}, a user that exists keeps its own.
        """
        check_name("user", name)
        if limits is None:
            limits = self.users[name].limits if name in self.users else {}
        user = User(name, password_hash, checked_tags(tags), checked_user_limits(limits))
        self._change(lambda: self.users.__setitem__(name, user))

    def set_user_tags(self, name, tags):
        user = self._existing_user(name)
        tags = checked_tags(tags)
        self._change(lambda: setattr(user, "tags", tags))

    def delete_user(self, name):
        """Delete a user with its permissions on every vhost."""
        self._existing_user(name)

        def delete():
            del self.users[name]
            for key in [key for key in self.permissions if key[0] == name]:
                del self.permissions[key]
            self.topic_permissions.forget(user=name)

        self._change(delete)

    def add_vhost(self, name, backend=None):
        """
        Create a vhost; with C{backend} (a backend string), it keeps its
        messages in a store of its own.
        """
        self.check_new_vhost(name)

        def add():
            self.vhosts.append(name)
            if backend is not None:
                self.vhost_backends[name] = backend

        self._change(add)

    def check_new_vhost(self, name):
        """
        Raise AccessChangeRefused unless C{name} may be a new vhost's name
        (valid, and not one already).
        """
        check_name("vhost", name)
        if name in self.vhosts:
            raise AccessChangeRefused(f"vhost '{name}' already exists")

    def vhost_backend(self, name):
        """The backend string of vhost C{name}'s own store, or None: it is on the broker's store."""
        return self.vhost_backends.get(name)

    def set_vhost_backends(self, backends):
        """
        Record new backend strings for vhosts with stores of their own (vhost
        name -> backend string), in one change: a migration moved their stores.
        """
        for name in backends:
            self._existing_vhost(name)
            if name not in self.vhost_backends:
                raise AccessChangeRefused(f"vhost '{name}' has no store of its own")
        self._change(lambda: self.vhost_backends.update(backends))

    def delete_vhost(self, name):
        """
        Forget a vhost with every permission on it (its queues and exchanges
        are the broker's to drop).
        """
        self._existing_vhost(name)

        def delete():
            self.vhosts.remove(name)
            self.vhost_backends.pop(name, None)
            for key in [key for key in self.permissions if key[1] == name]:
                del self.permissions[key]
            for key in [key for key in self.policy_records if key[0] == name]:
                del self.policy_records[key]
            self.runtime.forget_vhost(name)
            self.topic_permissions.forget(vhost=name)

        self._change(delete)

    def set_permissions(self, user, vhost, configure, write, read):
        """Give C{user} the three expressions on C{vhost} (RabbitMQ's C{set_permissions})."""
        self._existing_user(user)
        self._existing_vhost(vhost)
        for kind, expression in (("configure", configure), ("write", write), ("read", read)):
            try:
                re.compile(expression)
            except re.error as problem:
                raise AccessChangeRefused(
                    f"{kind} expression {expression!r} is not valid: {problem}"
                ) from None
        permissions = Permissions(configure, write, read)
        self._change(lambda: self.permissions.__setitem__((user, vhost), permissions))

    def clear_permissions(self, user, vhost):
        self._existing_user(user)
        self._existing_vhost(vhost)
        self._change(lambda: self.permissions.pop((user, vhost), None))

    def set_topic_permissions(self, user, vhost, exchange, write, read):
        """
        Give C{user} the C{write} and C{read} expressions for topic exchange
        C{exchange} on C{vhost} (RabbitMQ's C{set_topic_permissions}).
        """
        self._existing_user(user)
        self._existing_vhost(vhost)
        problem = invalid_expression(write=write, read=read)
        if problem is not None:
            raise AccessChangeRefused(problem)
        permission = TopicPermission(exchange, write, read)
        self._change(lambda: self.topic_permissions.set(user, vhost, permission))

    def clear_topic_permissions(self, user, vhost, exchange=None):
        """Take C{user}'s topic permissions for C{exchange} (None: every exchange) on C{vhost}."""
        self._existing_user(user)
        self._existing_vhost(vhost)
        self._change(lambda: self.topic_permissions.clear(user, vhost, exchange))

    def set_policy(self, vhost, name, pattern, definition, priority=0, apply_to="all"):
        """Create or replace policy C{name} of C{vhost} (RabbitMQ's C{set_policy}); returns the
        L{Policy}. Refuses (AccessChangeRefused, in RabbitMQ's words) what RabbitMQ's validation
        refuses."""
        self._existing_vhost(vhost)
        try:
            policy = check_policy(vhost, name, pattern, definition, priority, apply_to)
        except PolicyRefused as refusal:
            raise AccessChangeRefused(str(refusal)) from None
        self._change(lambda: self.policy_records.__setitem__((vhost, name), policy))
        return policy

    def clear_policy(self, vhost, name):
        """
        Delete policy C{name} of C{vhost}; refuses (as RabbitMQ: "Parameter
        does not exist") an unknown one.
        """
        self._existing_vhost(vhost)
        if (vhost, name) not in self.policy_records:
            raise AccessChangeRefused("Parameter does not exist")
        self._change(lambda: self.policy_records.pop((vhost, name)))

    # -- parameters and limits

    def set_parameter(self, vhost, component, name, value):
        """Set parameter C{name} of C{component} on C{vhost} (rabbitmqctl's C{set_parameter})."""
        self._existing_vhost(vhost)
        try:
            value = check_parameter(component, name, value)
        except ParameterRefused as refusal:
            raise AccessChangeRefused(str(refusal)) from None
        self._change(lambda: self.runtime.parameters.__setitem__((vhost, component, name), value))

    def clear_parameter(self, vhost, component, name):
        """Delete a runtime parameter; refuses (as RabbitMQ) one that does not exist."""
        if (vhost, component, name) not in self.runtime.parameters:
            raise AccessChangeRefused("Parameter does not exist")
        self._change(lambda: self.runtime.parameters.pop((vhost, component, name)))

    def set_global_parameter(self, name, value):
        """Set global parameter C{name} to C{value} (any JSON value, as RabbitMQ takes)."""
        if not isinstance(name, str) or not name:
            raise AccessChangeRefused("a global parameter needs a name")
        self._change(lambda: self.runtime.global_parameters.__setitem__(name, value))

    def clear_global_parameter(self, name):
        if name not in self.runtime.global_parameters:
            raise AccessChangeRefused("Parameter does not exist")
        self._change(lambda: self.runtime.global_parameters.pop(name))

    def set_user_limits(self, name, limits):
        """Replace user C{name}'s limits (C{{}}: none; RabbitMQ's C{set_user_limits})."""
        user = self._existing_user(name)
        limits = checked_user_limits(limits)
        self._change(lambda: setattr(user, "limits", limits))

    # -- the document on disk

    def document(self):
        """The database as RabbitMQ-style definitions (a dict ready for JSON)."""
        return {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "users": [
                {
                    "name": user.name, "password_hash": user.password_hash or "",
                    "hashing_algorithm": HASHING_ALGORITHM, "tags": list(user.tags),
                    "limits": dict(user.limits),
                }
                for user in self.users.values()
            ],
            "vhosts": [
                {"name": name, "backend": self.vhost_backends[name]}
                if name in self.vhost_backends else {"name": name}
                for name in self.vhosts
            ],
            "permissions": [
                {
                    "user": user, "vhost": vhost, "configure": permissions.configure,
                    "write": permissions.write, "read": permissions.read,
                }
                for (user, vhost), permissions in self.permissions.items()
            ],
            "policies": [
                {
                    "vhost": policy.vhost, "name": policy.name, "pattern": policy.pattern,
                    "apply-to": policy.apply_to, "definition": policy.definition,
                    "priority": policy.priority,
                }
                for policy in self.policy_records.values()
            ],
            **self.runtime.document(),
            "topic_permissions": self.topic_permissions.document(),
        }

    def _take_document(self, document):
        if document.get("format") != FORMAT or document.get("version") != FORMAT_VERSION:
            raise ValueError(f"not a {FORMAT} of version {FORMAT_VERSION}")
        users = {}
        for entry in document["users"]:
            if entry.get("hashing_algorithm", HASHING_ALGORITHM) != HASHING_ALGORITHM:
                raise ValueError(
                    f"user {entry['name']!r} has a hash made by {entry['hashing_algorithm']!r}"
                )
            users[entry["name"]] = User(
                entry["name"], entry["password_hash"] or None, entry["tags"],
                entry.get("limits"),  # none in a file from before limits
            )
        self.users = users
        self.vhosts = [entry["name"] for entry in document["vhosts"]]
        self.vhost_backends = {
            entry["name"]: entry["backend"] for entry in document["vhosts"] if "backend" in entry
        }
        self.permissions = {
            (entry["user"], entry["vhost"]): Permissions(
                entry["configure"], entry["write"], entry["read"]
            )
            for entry in document["permissions"]
        }
        self.policy_records = {
            (entry["vhost"], entry["name"]): Policy(
                entry["vhost"], entry["name"], entry["pattern"], entry["definition"],
                entry["priority"], entry["apply-to"],
            )
            for entry in document.get("policies", ())  # none in a file from before policies
        }
        self.runtime.take_document(document)
        # None in a file from before topic permissions:
        self.topic_permissions.load(document.get("topic_permissions", ()))

    def _change(self, apply):
        """Apply a change in memory and save it; if it cannot be saved, undo it and raise."""
        before = self.document()
        apply()
        try:
            self._save()
        except OSError:
            self._take_document(before)
            raise

    def replace_document(self, data):
        """
        Take a whole database (the bytes another node's L{on_saved} gave) in
        place of this one's, durably. Raises L{AccessDatabaseDamaged} naming the
        fault, changing nothing, when C{data} is not a database of this format.
        """
        checked = AccessDatabase(None)
        try:
            checked._take_document(json.loads(bytes(data).decode("utf-8")))
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as problem:
            raise AccessDatabaseDamaged(f"access database refused: {problem!r}") from None
        self._write(bytes(data))
        self._take_document(json.loads(bytes(data).decode("utf-8")))

    def document_bytes(self):
        """The database as the bytes its file holds (what L{on_saved} listeners get)."""
        return json.dumps(self.document(), indent=1, ensure_ascii=False).encode("utf-8")

    def _save(self):
        if self.path is None:
            return
        data = self.document_bytes()
        self._write(data)
        for listener in tuple(self.on_saved):
            listener(data)

    def _write(self, data):
        if self.path is not None:
            write_durably(self.path, data)

    def _existing_user(self, name):
        user = self.users.get(name)
        if user is None:
            raise AccessChangeRefused(f"no user '{name}'")
        return user

    def _existing_vhost(self, name):
        if name not in self.vhosts:
            raise AccessChangeRefused(f"no vhost '{name}'")

