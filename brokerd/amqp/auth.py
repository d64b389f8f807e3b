"""Who may connect: SASL PLAIN and AMQPLAIN checked through twisted.cred.

Users come from a file of ``user:password`` lines (twisted.cred's
C{FilePasswordDB}) or, without one, the single user guest/guest. When the
operator enables EXTERNAL, a TLS client that presented a certificate may log in
as the user its subject CN names, if that user exists (RabbitMQ's
rabbitmq_auth_mechanism_ssl with C{ssl_cert_login_from = common_name}). As in
RabbitMQ, guest may only log in from a loopback address, and user names and
passwords are UTF-8 in both mechanisms and in the users file.

A response comes from a peer that has not logged in yet: it is read by
offsets with every declared length checked, and anything but a string where a
credential belongs is a refused login, never a failure of the broker.
"""

import datetime
import decimal
import ipaddress

from twisted.cred import checkers, credentials, error, portal
from twisted.internet import defer
from zope.interface import Interface, implementer

from brokerd.amqp.arguments import Malformed, Unacceptable, decode_table_fields

MECHANISMS = ("PLAIN", "AMQPLAIN")  # offered unless --auth-mechanisms says otherwise
EXTERNAL = "EXTERNAL"
ALL_MECHANISMS = (*MECHANISMS, EXTERNAL)
LOOPBACK_ONLY_USERS = frozenset({"guest"})


class IBrokerUser(Interface):
    """The avatar of a logged-in client: just its user name."""


@implementer(portal.IRealm)
class _UserRealm:
    def requestAvatar(self, avatar_id, mind, *interfaces):
        if IBrokerUser not in interfaces:
            raise NotImplementedError("brokerd only hands out IBrokerUser avatars")
        name = avatar_id.decode() if isinstance(avatar_id, bytes) else avatar_id
        return IBrokerUser, name, lambda: None


class LoginRefused(Exception):
    """Credentials were missing, malformed or wrong; the text says which, never the password."""


def default_checker():
    """The checker used without a users file: guest/guest only."""
    return checkers.InMemoryUsernamePasswordDatabaseDontUse(guest=b"guest")


def file_checker(path):
    """A checker reading ``user:password`` lines from C{path} (re-read on each login)."""
    return checkers.FilePasswordDB(path, delim=b":", cache=False)


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
    """Checks start-ok credentials against a twisted.cred checker."""

    def __init__(self, checker=None, loopback_only_users=LOOPBACK_ONLY_USERS, mechanisms=MECHANISMS):
        self.checker = checker or default_checker()
        self.portal = portal.Portal(_UserRealm(), [self.checker])
        self.loopback_only_users = loopback_only_users
        self.mechanisms = tuple(mechanisms)

    def offered_mechanisms(self, transport):
        """The mechanisms connection.start offers on C{transport}: EXTERNAL only if it carries a client certificate."""
        if EXTERNAL in self.mechanisms and peer_certificate(transport) is None:
            return tuple(name for name in self.mechanisms if name != EXTERNAL)
        return self.mechanisms

    def user_exists(self, name):
        """True if user C{name} (str) may log in at all: the one question EXTERNAL asks of the users."""
        users = getattr(self.checker, "users", None)
        if users is not None:
            return name.encode() in users
        try:
            self.checker.getUser(name.encode())
        except (KeyError, OSError):
            return False
        return True

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
        if name in self.loopback_only_users and not is_loopback(peer_host):
            return defer.fail(LoginRefused(f"user {name!r} can only connect via localhost"))
        d = self.portal.login(credentials.UsernamePassword(username, password), None, IBrokerUser)

        def refused(failure):
            failure.trap(error.UnauthorizedLogin, error.UnhandledCredentials)
            raise LoginRefused(f"login was refused using authentication mechanism {mechanism}")

        d.addCallbacks(lambda result: result[1], refused)
        return d

    def _login_external(self, peer_host, transport):
        """EXTERNAL: the user the client certificate's subject CN names, refused in RabbitMQ's words."""
        certificate = peer_certificate(transport)
        if certificate is None:
            return defer.fail(LoginRefused("EXTERNAL login refused: connection has no peer certificate"))
        name = certificate.get_subject().commonName
        if not name:
            return defer.fail(LoginRefused("EXTERNAL login refused: no name found"))
        if not self.user_exists(name):
            return defer.fail(LoginRefused(f"EXTERNAL login refused: user '{name}' - invalid credentials"))
        if name in self.loopback_only_users and not is_loopback(peer_host):
            return defer.fail(LoginRefused(f"user {name!r} can only connect via localhost"))
        return defer.succeed(name)

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
        d = self.portal.login(credentials.UsernamePassword(username.encode(), secret), None, IBrokerUser)

        def refused(failure):
            failure.trap(error.UnauthorizedLogin, error.UnhandledCredentials)
            raise LoginRefused(f"the new secret of user {username!r} was refused")

        d.addCallbacks(lambda result: result[1], refused)
        return d
