"""Who may connect, and to which vhost: one login check for every protocol.

L{AccessControl} is RabbitMQ's C{rabbit_access_control} for brokerd: each
protocol server reads the credentials off its own wire (AMQP's SASL
responses in L{brokerd.amqp.auth}, the native hello) and hands them here.
Users and their password hashes live in the broker's
L{brokerd.access.interfaces.IAccessDatabase}; without one, an in-memory database
holding guest/guest. As in RabbitMQ, guest may only log in from a loopback
address (C{loopback_users}), user names and passwords are UTF-8, a refusal
says, in RabbitMQ's words, C{PLAIN login refused: user 'bob' - invalid
credentials}, and refused logins are counted per user name in the database.
A C{--users} file of C{user:password} lines is imported into the database at
start and again whenever it changes (L{UsersFileImport}). When the operator
enables EXTERNAL, a TLS client that presented a certificate may log in as the
user its subject CN names, if that user exists (RabbitMQ's
rabbitmq_auth_mechanism_ssl with C{ssl_cert_login_from = common_name}). A
user who logged in may open a vhost that exists and on which it has
permissions (530 NOT_ALLOWED in RabbitMQ's words otherwise), unless the vhost
or the user is at its connection limit (L{brokerd.access.limits}); its
channels then check every operation against a L{ResourceAccess}.
"""

import ipaddress
import os

from twisted.logger import Logger
from zope.interface import implementer

from brokerd.access.database import FULL_PERMISSIONS, AccessDatabase
from brokerd.access.limits import ClientLimits
from brokerd.access.permissions import ResourceAccess
from brokerd.errors import NotAllowed
from brokerd.access.interfaces import IAccessControl

log = Logger()

PLAIN = "PLAIN"
AMQPLAIN = "AMQPLAIN"
EXTERNAL = "EXTERNAL"
MECHANISMS = (PLAIN, AMQPLAIN)  # enabled unless --auth-mechanisms says otherwise
ALL_MECHANISMS = (*MECHANISMS, EXTERNAL)
# A user name and password, however the wire encodes them:
PASSWORD_MECHANISMS = frozenset({PLAIN, AMQPLAIN})
LOOPBACK_ONLY_USERS = frozenset({"guest"})
# A client refused at login gets its refusal this many seconds after the fault,
# so that a password guesser gets at most one answer per second and connection.
# RabbitMQ waits 3 s (SILENT_CLOSE_DELAY) before closing a failed handshake.
LOGIN_REFUSAL_DELAY = 1.0


class LoginRefused(Exception):
    """Credentials were missing, malformed or wrong; the text says which, never the password."""


class UsersFileImport:
    """
    A file of UTF-8 C{user:password} lines imported into an access database:
    each user is created or given that password (hashed), and a user it
    creates gets every permission on the vhost C{/}, as the file's users had
    before the database existed. L{refresh} imports it again if it changed.
    """

    def __init__(self, path, database):
        self.path = path
        self.database = database
        self._seen = None  # (mtime_ns, size) of the version imported last

    def refresh(self):
        """
        Import the file if it changed since the last import; raises OSError if
        it cannot be read.
        """
        status = os.stat(self.path)
        seen = (status.st_mtime_ns, status.st_size)
        if seen == self._seen:
            return
        with open(self.path, "rb") as file:
            lines = file.read().decode("utf-8").splitlines()
        database = self.database
        for line in lines:
            name, colon, password = line.partition(":")
            if not colon or not name:
                continue
            if database.user(name) is None:
                database.add_user(name, password)
            elif not database.check_password(name, password):
                database.set_password(name, password)
            if database.permissions_of(name, "/") is None and database.vhost_exists("/"):
                database.set_permissions(name, "/", *FULL_PERMISSIONS)
        self._seen = seen


def is_loopback(host):
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a UNIX socket or a name: not an IP loopback address


def peer_certificate(transport):
    """The certificate (a pyOpenSSL X509) the client presented on a TLS C{transport}, or None."""
    get = getattr(transport, "getPeerCertificate", None)
    if get is None:
        return None
    try:
        return get()
    except Exception:  # noqa: BLE001 - not a TLS connection after all, or its handshake is not done
        return None


def utf8(raw, what):
    """C{raw} (bytes) if it is valid UTF-8; a L{LoginRefused} naming C{what} otherwise."""
    try:
        raw.decode()
    except UnicodeDecodeError:
        raise LoginRefused(f"{what} is not valid UTF-8") from None
    return raw


@implementer(IAccessControl)
class AccessControl:
    """
    Logins and vhost access checked against an L{IAccessDatabase}, for every protocol.

    @ivar access: the broker's L{IAccessDatabase}.
    @ivar mechanisms: the login mechanisms the operator enabled (C{--auth-mechanisms}).
    @ivar limits: the L{ClientLimits} of C{access}, checked on connections and channels.
    """

    def __init__(
        self, access=None, loopback_only_users=LOOPBACK_ONLY_USERS, users_file=None,
        mechanisms=MECHANISMS,
    ):
        """
        @param access: the broker's L{IAccessDatabase}; without one, guest/guest in memory.
        @param users_file: a L{UsersFileImport} refreshed before each login, or None.
        """
        self.access = access if access is not None else AccessDatabase.in_memory()
        self.loopback_only_users = loopback_only_users
        self.users_file = users_file
        self.mechanisms = tuple(mechanisms)
        self.limits = ClientLimits(self.access)

    def user_exists(self, name):
        """
        Whether a user called C{name} exists: the one question EXTERNAL (a
        login with no password) asks.
        """
        return self.access.user(name) is not None

    def check_password_login(self, mechanism, name, password, peer_host):
        """
        The name of user C{name} (str) if C{password} (UTF-8 bytes) is its
        password and it may log in from C{peer_host}; raises L{LoginRefused}
        in RabbitMQ's words, naming C{mechanism}, otherwise.
        """
        self._refresh_users_file()
        if not self.access.check_password(name, password):
            raise self._refused(mechanism, name, "invalid credentials")
        return self._admitted_from(mechanism, name, peer_host)

    def check_certificate_login(self, peer_host, transport):
        """
        EXTERNAL: the user the client certificate's subject CN names, refused
        in RabbitMQ's words.
        """
        certificate = peer_certificate(transport)
        if certificate is None:
            raise LoginRefused("EXTERNAL login refused: connection has no peer certificate")
        name = certificate.get_subject().commonName
        if not name:
            raise LoginRefused("EXTERNAL login refused: no name found")
        self._refresh_users_file()
        if not self.user_exists(name):
            raise self._refused(EXTERNAL, name, "invalid credentials")
        return self._admitted_from(EXTERNAL, name, peer_host)

    def check_vhost_access(self, user, vhost, connections=None):
        """
        The L{ResourceAccess} of C{user} on C{vhost}, which must exist and on
        which the user must have permissions; raises L{NotAllowed} (530) with
        RabbitMQ's texts otherwise. With C{connections} (the broker's open
        ones), the vhost's and the user's connection limits are checked first.
        """
        access = self.access
        if not access.vhost_exists(vhost):
            raise NotAllowed(f"vhost {vhost} not found")
        if connections is not None:
            self.limits.check_connection(user, vhost, connections)
        permissions = access.permissions_of(user, vhost)
        if permissions is None:
            raise NotAllowed(f"access to vhost '{vhost}' refused for user '{user}'")
        return ResourceAccess(user, vhost, permissions, access.topic_rules(user, vhost))

    def _admitted_from(self, mechanism, name, peer_host):
        """
        A known user's login, refused as RabbitMQ's loopback_users rule says if
        it comes from afar.
        """
        if name in self.loopback_only_users and not is_loopback(peer_host):
            raise self._refused(mechanism, name, "can only connect via localhost", " ")
        return name

    def _refused(self, mechanism, name, why, separator=" - "):
        """A refused login, counted against the user name, in RabbitMQ's words."""
        self.access.count_failed_login(name)
        return LoginRefused(f"{mechanism} login refused: user '{name}'{separator}{why}")

    def _refresh_users_file(self):
        """
        Take in the users file's changes; one that cannot be read leaves the
        database as it is.
        """
        if self.users_file is not None:
            try:
                self.users_file.refresh()
            except (OSError, ValueError) as problem:
                log.warn(
                    "--users: cannot import {path!r}: {problem}",
                    path=self.users_file.path, problem=problem,
                )
