"""Topic permissions: which routing keys a user may publish with and bind with, per topic exchange.

RabbitMQ's C{set_topic_permissions}: a user may have, on one vhost, one entry
per exchange, each a C{write} and a C{read} regular expression. On a topic
exchange with an entry, a publish's routing key must match C{write} and a
binding's (queue.bind, queue.unbind, exchange.bind, exchange.unbind, on the
source) must match C{read}; an exchange without an entry, or one of another
type, allows every key. As in C{rabbit_auth_backend_internal}, C{{username}}
and C{{vhost}} in an expression stand for the user's and the vhost's names
(replaced as they are, not escaped), the expression is searched for anywhere in
the key, and an empty one allows only the empty key. A refusal is 403
ACCESS_REFUSED in RabbitMQ's words (C{rabbit_access_control}).

L{TopicPermissions} holds the entries (the access database saves them) and,
for each user and vhost a connection asked about, a live dict of compiled
rules that every later change updates in place, so that a channel holds it
from login on and tests it per publish: an empty dict (no entry for that user
on that vhost) costs one truth test.
"""

import re

from brokerd.errors import AccessRefused

TOPIC_EXCHANGE_TYPE = "topic"


class TopicPermission:
    """One entry: C{exchange}'s C{write} and C{read} expressions, as the operator gave them."""

    __slots__ = ("exchange", "write", "read")

    def __init__(self, exchange, write, read):
        self.exchange, self.write, self.read = exchange, write, read

    def __eq__(self, other):
        return isinstance(other, TopicPermission) and self.as_tuple() == other.as_tuple()

    def as_tuple(self):
        return self.exchange, self.write, self.read

    def __repr__(self):
        return f"TopicPermission{self.as_tuple()!r}"


class TopicRule:
    """One entry compiled for one user on one vhost, its variables replaced."""

    __slots__ = ("write", "read")

    def __init__(self, permission, user, vhost):
        self.write = _compiled(permission.write, user, vhost)
        self.read = _compiled(permission.read, user, vhost)


def _compiled(expression, user, vhost):
    expanded = (expression or "^$").replace("{username}", user).replace("{vhost}", vhost)
    try:
        return re.compile(expanded)
    except re.error:
        # A name that makes the expression invalid (e.g. a user called "a(b"): nothing matches.
        return re.compile(r"(?!)")


class TopicPermissions:
    """
    Every topic permission of a broker, by user and vhost.

    @ivar entries: C{(user, vhost)} -> exchange name -> L{TopicPermission}.
    """

    def __init__(self):
        self.entries = {}
        self._live = {}  # (user, vhost) -> exchange name -> TopicRule, updated in place

    def rules(self, user, vhost):
        """
        The compiled rules of C{user} on C{vhost} (exchange name -> L{TopicRule}):
        a dict that later changes update in place, empty while there are none.
        """
        key = (user, vhost)
        live = self._live.get(key)
        if live is None:
            live = self._live[key] = {}
            self._refresh(key)
        return live

    def of(self, user=None, vhost=None):
        """C{(user, vhost, TopicPermission)} for every entry, or those of C{user} and/or
        C{vhost}, sorted by vhost, user and exchange."""
        return [
            (on_user, on_vhost, permission)
            for (on_user, on_vhost), exchanges in sorted(
                self.entries.items(), key=lambda item: (item[0][1], item[0][0])
            )
            if (user is None or on_user == user) and (vhost is None or on_vhost == vhost)
            for _, permission in sorted(exchanges.items())
        ]

    def set(self, user, vhost, permission):
        """Add or replace C{user}'s entry for C{permission.exchange} on C{vhost}."""
        self.entries.setdefault((user, vhost), {})[permission.exchange] = permission
        self._refresh((user, vhost))

    def clear(self, user, vhost, exchange=None):
        """Take C{user}'s entry for C{exchange} on C{vhost} (None: every one); none is no error."""
        key = (user, vhost)
        exchanges = self.entries.get(key)
        if exchanges is not None:
            if exchange is None:
                exchanges.clear()
            else:
                exchanges.pop(exchange, None)
            if not exchanges:
                del self.entries[key]
        self._refresh(key)

    def forget(self, user=None, vhost=None):
        """Take every entry of user C{user}, or on vhost C{vhost}: it is deleted."""
        for key in list(self.entries):
            if key[0] == user or key[1] == vhost:
                self.clear(*key)

    def document(self):
        """Every entry in RabbitMQ's definitions' shape (C{user}, C{vhost}, C{exchange},
        C{write}, C{read}), as the access database saves them."""
        return [
            {
                "user": user, "vhost": vhost, "exchange": permission.exchange,
                "write": permission.write, "read": permission.read,
            }
            for user, vhost, permission in self.of()
        ]

    def load(self, document):
        """Make the entries of C{document} (as L{document} writes it) all there is."""
        self.entries = {}
        for entry in document:
            permission = TopicPermission(entry["exchange"], entry["write"], entry["read"])
            self.entries.setdefault((entry["user"], entry["vhost"]), {})[entry["exchange"]] = (
                permission
            )
        for key in self._live:
            self._refresh(key)

    def _refresh(self, key):
        live = self._live.get(key)
        if live is None:
            return
        user, vhost = key
        live.clear()
        for exchange, permission in self.entries.get(key, {}).items():
            live[exchange] = TopicRule(permission, user, vhost)


def invalid_expression(**expressions):
    """None if every one of C{expressions} (kind -> text) compiles, else what is wrong."""
    for kind, expression in expressions.items():
        try:
            re.compile(expression)
        except re.error as problem:
            return f"{kind} expression {expression!r} is not valid: {problem}"
    return None


def checked_topic_permissions(entries, known_users, in_vhost, refused):
    """
    The C{topic_permissions} section of a definitions document as C{(user, vhost,
    TopicPermission)}; raises C{refused} (an exception class) naming the first fault:
    a field that is not text, an unknown user (C{known_users}: the names that
    exist or are being imported), an invalid expression, or a vhost C{in_vhost}
    (called with the entry and the section's name) refuses.
    """
    found = []
    for entry in entries:
        fields = [entry.get(key) for key in ("user", "exchange", "write", "read")]
        if not all(isinstance(value, str) for value in fields):
            raise refused(
                f"topic_permissions: 'user', 'exchange', 'write' and 'read' must be strings"
                f" in {entry!r:.200}"
            )
        user, exchange, write, read = fields
        on = in_vhost(entry, "topic_permissions")
        if user not in known_users:
            raise refused(f"topic_permissions: User {user} does not exist")
        problem = invalid_expression(write=write, read=read)
        if problem is not None:
            raise refused(f"topic_permissions: {problem} ({on}/{user}/{exchange})")
        found.append((user, on, TopicPermission(exchange, write, read)))
    return found


def _refusal(routing_key, exchange, vhost, user):
    return AccessRefused(
        f"access to topic '{routing_key}' in exchange '{exchange}' in vhost '{vhost}'"
        f" refused for user '{user}'"
    )


def check_topic_write(rules, vhost, exchange_name, routing_key, user):
    """
    Raise 403 unless C{rules} (a user's, on C{vhost}, a L{brokerd.model.vhost.VirtualHost})
    allow publishing with C{routing_key} to C{exchange_name}. An exchange that does not
    exist, is internal or is not a topic exchange is left to the publish to refuse or route.
    """
    rule = rules.get(exchange_name)
    if rule is None:
        return
    exchange = vhost.exchanges.get(exchange_name)
    if exchange is None or exchange.internal or exchange.type_name != TOPIC_EXCHANGE_TYPE:
        return
    if rule.write.search(routing_key) is None:
        raise _refusal(routing_key, exchange_name, vhost.name, user)


def check_topic_read(rules, vhost, exchange_name, routing_key, user):
    """Raise 403 unless C{rules} allow binding from topic exchange C{exchange_name} with
    C{routing_key} (or unbinding it)."""
    rule = rules.get(exchange_name)
    if rule is None:
        return
    exchange = vhost.exchanges.get(exchange_name)
    if exchange is None or exchange.type_name != TOPIC_EXCHANGE_TYPE:
        return
    if rule.read.search(routing_key) is None:
        raise _refusal(routing_key, exchange_name, vhost.name, user)
