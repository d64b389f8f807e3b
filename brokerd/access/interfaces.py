"""The roles of access control: the login check every protocol server asks
(L{IAccessControl}), the users, vhosts and permissions it consults
(L{IAccessDatabase}), and rabbitmqctl's commands that change them
(L{IAccessCommands}), so that AMQP, the native protocol and the management API
share one implementation of each."""

from zope.interface import Attribute, Interface


class IAccessControl(Interface):
    """
    The login check every protocol server asks (L{brokerd.access.login.AccessControl}):
    each reads the credentials off its own wire and hands them here, so that
    AMQP and the native protocol admit the same users to the same vhosts.
    """

    access = Attribute("the broker's IAccessDatabase the checks consult")
    mechanisms = Attribute("the login mechanisms the operator enabled (PLAIN, AMQPLAIN, EXTERNAL)")

    def check_password_login(mechanism, name, password, peer_host):
        """The user name if C{password} (UTF-8 bytes) is C{name}'s and it may log in from
        C{peer_host}; raises LoginRefused in RabbitMQ's words (naming C{mechanism}), counting
        the refusal."""

    def check_certificate_login(peer_host, transport):
        """EXTERNAL: the user the TLS client certificate's CN names; raises LoginRefused."""

    limits = Attribute("the ClientLimits checked on new connections and channels")

    def check_vhost_access(user, vhost, connections=None):
        """The user's ResourceAccess on C{vhost}; raises NotAllowed (530) with RabbitMQ's texts,
        also when the vhost or the user is at its connection limit among C{connections}."""


class IAccessDatabase(Interface):
    """
    Users, vhosts and permissions as the protocol servers consult them
    (L{brokerd.access.database.AccessDatabase} keeps them durably): who may
    log in, which vhosts exist, and what a user may do on one.
    """

    failed_logins = Attribute("user name -> how many logins as that user were refused since start")

    def check_password(name, password):
        """Whether user C{name} exists and C{password} (str or UTF-8 bytes) is its password."""

    def user(name):
        """The user called C{name} (with C{name}, C{password_hash} and C{tags}), or None."""

    def count_failed_login(name):
        """A login as C{name} was refused: count it in C{failed_logins}."""

    def vhost_exists(name):
        """Whether vhost C{name} exists."""

    def permissions_of(user, vhost):
        """
        C{user}'s permissions on C{vhost} (C{configure}, C{write}, C{read}
        expressions), or None: none.
        """

    def policies(vhost=None):
        """
        The L{brokerd.model.policy_effects.Policy} records of C{vhost} (None:
        of every vhost), highest priority first.
        """

    def topic_rules(user, vhost):
        """
        C{user}'s compiled topic permissions on C{vhost}: a dict (exchange name
        -> rule) that later changes update in place, empty while there are none.
        """


class IAccessCommands(Interface):
    """rabbitmqctl's user, vhost, permission and policy commands, and
    definitions export and import, for every protocol
    (L{brokerd.access.commands})."""

    def check_administrator(user):
        """
        Raise L{brokerd.errors.AccessRefused} (403) unless user C{user} (None:
        nobody) is an administrator.
        """

    def run(user, command, arguments=(), vhost="/", backend=None):
        """C{command} (e.g. C{"add_user"}) for user C{user}: a Deferred of a table (C{columns},
        C{rows}) once the change is durable, or failing with a L{brokerd.errors.BrokerError} that
        says why not."""
