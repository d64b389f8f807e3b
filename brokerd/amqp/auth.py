"""Who may connect: SASL PLAIN and AMQPLAIN checked against the access database.

Users, their password hashes and their permissions live in the broker's
L{brokerd.interfaces.IAccessDatabase} (L{brokerd.access.database}); without
one, an in-memory database holding guest/guest. As in RabbitMQ, guest may
only log in from a loopback address (RabbitMQ's C{loopback_users}), user
names and passwords are UTF-8, and a refusal says, in RabbitMQ's words,
C{PLAIN login refused: user 'bob' - invalid credentials}; refused logins are
counted per user name in the database. A C{--users} file of C{user:password}
lines is imported into the database at start and again whenever it changes
(L{UsersFileImport}). When the operator enables EXTERNAL, a TLS client that
presented a certificate may log in as the user its subject CN names, if that
user exists (RabbitMQ's rabbitmq_auth_mechanism_ssl with
C{ssl_cert_login_from = common_name}).

A response comes from a peer that has not logged in yet: it is read by
offsets with every declared length checked, and anything but a string where a
credential belongs is a refused login, never a failure of the broker.
"""

import datetime
import decimal
import ipaddress
import os

from twisted.internet import defer
from twisted.logger import Logger

from brokerd.access.database import FULL_PERMISSIONS, AccessDatabase
from brokerd.amqp.arguments import Malformed, Unacceptable, decode_table_fields

log = Logger()

MECHANISMS = ("PLAIN", "AMQPLAIN")  # offered unless --auth-mechanisms says otherwise
EXTERNAL = "EXTERNAL"
ALL_MECHANISMS = (*MECHANISMS, EXTERNAL)
LOOPBACK_ONLY_USERS = frozenset({"guest"})


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
        """Import the file if it changed since the last import; raises OSError if it cannot be read."""
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


def parse_response(mechanism, response):
    """
    The C{(username, password)} in a connection.start-ok response (bytes), as
    UTF-8 bytes. Raises L{LoginRefused} saying what is wrong with a response
    that holds no such pair.
    """
    if mechanism == "PLAIN":
        parts = response.split(b"\0")
        if len(parts) != 3:
            raise LoginRefused("PLAIN response must be \\0user\\0password")
        return _utf8(parts[1], "PLAIN user name"), _utf8(parts[2], "PLAIN password")
    if mechanism == "AMQPLAIN":
        try:
            table = decode_table_fields(response, 0, len(response))
        except (Malformed, Unacceptable) as problem:
            raise LoginRefused(f"AMQPLAIN response is not a field table: {problem}") from None
        login, password = table.get("LOGIN"), table.get("PASSWORD")
        if login is None or password is None:
            raise LoginRefused("AMQPLAIN response needs LOGIN and PASSWORD")
        return _credential(login, "LOGIN"), _credential(password, "PASSWORD")
    raise LoginRefused(f"unsupported authentication mechanism {mechanism!r}; use one of {', '.join(MECHANISMS)}")


def _credential(value, name):
    """An AMQPLAIN LOGIN or PASSWORD as UTF-8 bytes: a long string or byte array, nothing else."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray)):
        return _utf8(bytes(value), f"AMQPLAIN {name}")
    kind = _KINDS.get(type(value), type(value).__name__)
    raise LoginRefused(f"AMQPLAIN {name} must be a string, not {kind}")


_KINDS = {
    bool: "a boolean",
    int: "an integer",
    float: "a floating-point number",
    decimal.Decimal: "a decimal",
    datetime.datetime: "a timestamp",
    list: "an array",
    dict: "a field table",
}


def _utf8(raw, what):
    try:
        raw.decode()
    except UnicodeDecodeError:
        raise LoginRefused(f"{what} is not valid UTF-8") from None
    return raw


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


class Authenticator:
    """Checks start-ok credentials and new secrets against an L{IAccessDatabase}."""

    def __init__(self, access=None, loopback_only_users=LOOPBACK_ONLY_USERS, users_file=None, mechanisms=MECHANISMS):
        """
        @param access: the broker's L{IAccessDatabase}; without one, guest/guest in memory.
        @param users_file: a L{UsersFileImport} refreshed before each login, or None.
        @param mechanisms: the SASL mechanisms offered (C{--auth-mechanisms}).
        """
        self.access = access if access is not None else AccessDatabase.in_memory()
        self.loopback_only_users = loopback_only_users
        self.users_file = users_file
        self.mechanisms = tuple(mechanisms)

    def user_exists(self, name):
        """Whether a user called C{name} exists: the one question EXTERNAL (a login with no password) asks."""
        return self.access.user(name) is not None

    def offered_mechanisms(self, transport):
        """The mechanisms connection.start offers on C{transport}: EXTERNAL only if it carries a client certificate."""
        if EXTERNAL in self.mechanisms and peer_certificate(transport) is None:
            return tuple(name for name in self.mechanisms if name != EXTERNAL)
        return self.mechanisms


    def login(self, mechanism, response, peer_host, transport=None):
        """
        A Deferred firing with the user name, or failing with L{LoginRefused}.
        C{transport} gives EXTERNAL the client's certificate.
        """
        if mechanism not in self.mechanisms:
            return defer.fail(LoginRefused(f"unsupported authentication mechanism {mechanism!r}; use one of"
                                           f" {', '.join(self.offered_mechanisms(transport))}"))
        if mechanism == EXTERNAL:
            return self._login_external(peer_host, transport)
        try:
            username, password = parse_response(mechanism, response)
        except LoginRefused:
            return defer.fail()
        name = username.decode()
        self._refresh_users_file()
        if not self.access.check_password(name, password):
            return self._refused(mechanism, name, "invalid credentials")
        return self._admitted_from(mechanism, name, peer_host)

    def _login_external(self, peer_host, transport):
        """EXTERNAL: the user the client certificate's subject CN names, refused in RabbitMQ's words."""
        certificate = peer_certificate(transport)
        if certificate is None:
            return defer.fail(LoginRefused("EXTERNAL login refused: connection has no peer certificate"))
        name = certificate.get_subject().commonName
        if not name:
            return defer.fail(LoginRefused("EXTERNAL login refused: no name found"))
        self._refresh_users_file()
        if not self.user_exists(name):
            return self._refused(EXTERNAL, name, "invalid credentials")
        return self._admitted_from(EXTERNAL, name, peer_host)

    def _admitted_from(self, mechanism, name, peer_host):
        """A known user's login, refused as RabbitMQ's loopback_users rule says if it comes from afar."""
        if name in self.loopback_only_users and not is_loopback(peer_host):
            return self._refused(mechanism, name, "can only connect via localhost", " ")
        return defer.succeed(name)

    def _refused(self, mechanism, name, why, separator=" - "):
        """A refused login, counted against the user name, in RabbitMQ's words."""
        self.access.count_failed_login(name)
        return defer.fail(LoginRefused(f"{mechanism} login refused: user '{name}'{separator}{why}"))

    def check_secret(self, username, secret):
        """
        A Deferred firing with C{username} if C{secret} (bytes) is still that
        user's password, for connection.update-secret, or failing with
        L{LoginRefused}.
        """
        try:
            secret = _utf8(secret, "the new secret")
        except LoginRefused:
            return defer.fail()
        self._refresh_users_file()
        if not self.access.check_password(username, secret):
            return defer.fail(LoginRefused(f"the new secret of user {username!r} was refused"))
        return defer.succeed(username)

    def _refresh_users_file(self):
        """Take in the users file's changes; one that cannot be read leaves the database as it is."""
        if self.users_file is not None:
            try:
                self.users_file.refresh()
            except (OSError, ValueError) as problem:
                log.warn("--users: cannot import {path!r}: {problem}", path=self.users_file.path, problem=problem)
