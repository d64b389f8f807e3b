"""Who may connect: SASL PLAIN and AMQPLAIN checked through twisted.cred.

Users come from a file of ``user:password`` lines (twisted.cred's
C{FilePasswordDB}) or, without one, the single user guest/guest. As in
RabbitMQ, guest may only log in from a loopback address.
"""

import ipaddress

from pamqp import decode as pamqp_decode
from twisted.cred import checkers, credentials, error, portal
from twisted.internet import defer
from zope.interface import Interface, implementer

MECHANISMS = ("PLAIN", "AMQPLAIN")
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
    """The C{(username, password)} in a connection.start-ok response, as bytes."""
    if mechanism == "PLAIN":
        parts = response.split(b"\0")
        if len(parts) != 3:
            raise LoginRefused("PLAIN response must be \\0user\\0password")
        return parts[1], parts[2]
    if mechanism == "AMQPLAIN":
        try:
            _, table = pamqp_decode.field_table(len(response).to_bytes(4, "big") + response)
        except Exception as problem:
            raise LoginRefused(f"AMQPLAIN response is not a field table: {problem}") from None
        login, password = table.get("LOGIN"), table.get("PASSWORD")
        if login is None or password is None:
            raise LoginRefused("AMQPLAIN response needs LOGIN and PASSWORD")
        return _as_bytes(login), _as_bytes(password)
    raise LoginRefused(f"unsupported authentication mechanism {mechanism!r}; use one of {', '.join(MECHANISMS)}")


def _as_bytes(value):
    return value.encode() if isinstance(value, str) else bytes(value)


def is_loopback(host):
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a UNIX socket or a name: not an IP loopback address


class Authenticator:
    """Checks start-ok credentials against a twisted.cred checker."""

    def __init__(self, checker=None, loopback_only_users=LOOPBACK_ONLY_USERS):
        self.portal = portal.Portal(_UserRealm(), [checker or default_checker()])
        self.loopback_only_users = loopback_only_users

    def login(self, mechanism, response, peer_host):
        """
        A Deferred firing with the user name, or failing with L{LoginRefused}.
        """
        try:
            username, password = parse_response(mechanism, response)
        except LoginRefused:
            return defer.fail()
        name = username.decode(errors="replace")
        if name in self.loopback_only_users and not is_loopback(peer_host):
            return defer.fail(LoginRefused(f"user {name!r} can only connect via localhost"))
        d = self.portal.login(credentials.UsernamePassword(username, password), None, IBrokerUser)

        def refused(failure):
            failure.trap(error.UnauthorizedLogin, error.UnhandledCredentials)
            raise LoginRefused(f"login was refused using authentication mechanism {mechanism}")

        d.addCallbacks(lambda result: result[1], refused)
        return d
