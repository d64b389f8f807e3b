"""Permission checks: one place for every protocol's operations.

A L{ResourceAccess} is one user's permissions on one vhost with the three
expressions compiled once, made when a connection opens and consulted by
its channels (L{brokerd.session.channel.Channel}). The meaning is RabbitMQ's
(C{rabbit_auth_backend_internal}): an expression is searched for anywhere in
the resource's name (anchor it with C{^} and C{$}), an empty one allows
nothing, and the default exchange is matched as C{amq.default}. A refusal is
403 ACCESS_REFUSED in RabbitMQ's words (C{rabbit_access_control}). The
user's topic permissions on the vhost (L{brokerd.access.topic_permissions})
come with it, and are checked on topic exchanges' publishes and bindings.
"""

import re
import types

from brokerd.access.topic_permissions import check_topic_read, check_topic_write
from brokerd.errors import AccessRefused, PreconditionFailed
from brokerd.model.names import generate_queue_name

DEFAULT_EXCHANGE_RESOURCE = "amq.default"
NO_TOPIC_RULES = types.MappingProxyType({})


class ResourceAccess:
    """
    What one user may do on one vhost.

    @ivar user: the user's name.
    @ivar vhost: the vhost's name.
    @ivar topic_rules: the user's compiled topic permissions on the vhost, kept up
        to date by the access database: exchange name -> rule, empty while none.
    """

    __slots__ = ("user", "vhost", "topic_rules", "_configure", "_write", "_read")

    def __init__(self, user, vhost, permissions, topic_rules=NO_TOPIC_RULES):
        """
        @param permissions: the user's L{brokerd.access.database.Permissions} on C{vhost}.
        @param topic_rules: the access database's C{topic_rules(user, vhost)}.
        """
        self.user = user
        self.vhost = vhost
        self.topic_rules = topic_rules
        self._configure = _compiled(permissions.configure)
        self._write = _compiled(permissions.write)
        self._read = _compiled(permissions.read)

    def check_configure(self, kind, name):
        """Declaring or deleting the C{kind} (exchange, queue) called C{name}."""
        resource = name or DEFAULT_EXCHANGE_RESOURCE
        if self._configure.search(resource) is None:
            raise self._refusal("configure", kind, resource)

    def check_write(self, kind, name):
        """Publishing to an exchange; binding to a queue or exchange (the destination)."""
        resource = name or DEFAULT_EXCHANGE_RESOURCE
        if self._write.search(resource) is None:
            raise self._refusal("write", kind, resource)

    def check_read(self, kind, name):
        """
        Consuming from, getting from or purging a queue; binding from an
        exchange (the source).
        """
        resource = name or DEFAULT_EXCHANGE_RESOURCE
        if self._read.search(resource) is None:
            raise self._refusal("read", kind, resource)

    def queue_to_declare(self, name, passive, arguments=None):
        """
        C{(name, server_named)} of a queue.declare, its configure permission
        checked; an empty name is replaced by the one the broker picks, as
        RabbitMQ checks that one. A passive declare needs no permission. A
        queue that dead-letters (C{x-dead-letter-exchange} in C{arguments})
        also needs read on itself and write on that exchange, as in
        RabbitMQ's C{rabbit_channel}: its dead messages are published there.
        """
        if passive:
            return name, False
        server_named = not name
        if server_named:
            name = generate_queue_name()
        self.check_configure("queue", name)
        dead_letter_exchange = arguments.get("x-dead-letter-exchange") if arguments else None
        if isinstance(dead_letter_exchange, bytes):
            dead_letter_exchange = dead_letter_exchange.decode("utf-8", "replace")
        # Any other type is refused by the declare itself (406).
        if isinstance(dead_letter_exchange, str):
            self.check_read("queue", name)
            self.check_write("exchange", dead_letter_exchange)
        return name, server_named

    def check_binding(self, destination_kind, destination, source, routing_key="", vhost=None):
        """
        A binding needs write on its destination and read on its source
        exchange (RabbitMQ's order), then, if the source is a topic exchange of
        C{vhost} (the L{brokerd.model.vhost.VirtualHost}) with a topic
        permission, a C{routing_key} its C{read} expression matches.
        """
        self.check_write(destination_kind, destination)
        self.check_read("exchange", source)
        if self.topic_rules and vhost is not None:
            check_topic_read(self.topic_rules, vhost, source, routing_key, self.user)

    def check_topic_write(self, vhost, message):
        """
        A publish to a topic exchange of C{vhost} with a topic permission needs a
        routing key its C{write} expression matches (RabbitMQ checks it after the
        exchange's write permission; the channel asks only while C{topic_rules}
        is not empty).
        """
        check_topic_write(
            self.topic_rules, vhost, message.exchange, message.routing_key, self.user
        )

    def check_publish(self, message, writable):
        """
        A publish needs write on its exchange and a C{user_id} naming the user
        who logged in; C{writable} is the channel's set of exchanges already
        allowed, which this adds to, so a channel checks each exchange once.
        """
        exchange = message.exchange
        if exchange not in writable:
            self.check_write("exchange", exchange)
            writable.add(exchange)
        user_id = message.properties.user_id
        if user_id:
            self.check_user_id(user_id)

    def check_user_id(self, user_id):
        """A publish's C{user_id} property must name the user who logged in (RabbitMQ's 406)."""
        if user_id != self.user:
            raise PreconditionFailed(
                f"user_id property set to '{user_id}'"
                f" but authenticated user was '{self.user}'"
            )

    def _refusal(self, permission, kind, name):
        # RabbitMQ's words name the resource, not which of the three permissions it lacks.
        return AccessRefused(
            f"access to {kind} '{name}' in vhost '{self.vhost}' refused for user '{self.user}'"
        )


def _compiled(expression):
    # RabbitMQ reads an empty expression as ^$: with the default exchange named
    # amq.default, nothing matches.
    return re.compile(expression or "^$")


class UncheckedAccess:
    """
    The access of an unchecked internal user (a connection made in-process,
    without a login): everything.
    """

    __slots__ = ()
    topic_rules = NO_TOPIC_RULES

    def check_configure(self, kind, name):
        pass

    check_write = check_read = check_configure

    def queue_to_declare(self, name, passive, arguments=None):
        return name, False

    def check_binding(self, destination_kind, destination, source, routing_key="", vhost=None):
        pass

    def check_topic_write(self, vhost, message):
        pass

    def check_publish(self, message, writable):
        pass


UNCHECKED = UncheckedAccess()
