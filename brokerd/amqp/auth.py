"""Who may connect over AMQP: SASL PLAIN, AMQPLAIN and EXTERNAL read off the wire.

The protocol-free check of users, passwords, the guest loopback rule, counted
refusals and the vhost access lives in L{brokerd.access.login.AccessControl},
which the native protocol asks too; L{Authenticator} adds what is AMQP's own:
the SASL mechanisms offered in connection.start and the responses of
start-ok, and Deferreds for the handshake. A response comes from a peer that
has not logged in yet: it is read by offsets with every declared length
checked, and anything but a string where a credential belongs is a refused
login, never a failure of the broker.
"""

import datetime
import decimal

from twisted.internet import defer

# Tap and tests import UsersFileImport and the names from here.
from brokerd.access.login import (  # noqa: F401
    ALL_MECHANISMS,
    EXTERNAL,
    MECHANISMS,
    AccessControl,
    LoginRefused,
    UsersFileImport,
    peer_certificate,
    utf8,
)
from brokerd.amqp.table_arguments import Malformed, Unacceptable, decode_table_fields


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
        return utf8(parts[1], "PLAIN user name"), utf8(parts[2], "PLAIN password")
    if mechanism == "AMQPLAIN":
        try:
            table = decode_table_fields(response, 0, len(response))
        except (Malformed, Unacceptable) as problem:
            raise LoginRefused(f"AMQPLAIN response is not a field table: {problem}") from None
        login, password = table.get("LOGIN"), table.get("PASSWORD")
        if login is None or password is None:
            raise LoginRefused("AMQPLAIN response needs LOGIN and PASSWORD")
        return _credential(login, "LOGIN"), _credential(password, "PASSWORD")
    raise LoginRefused(
        f"unsupported authentication mechanism {mechanism!r}; use one of {', '.join(MECHANISMS)}"
    )


def _credential(value, name):
    """An AMQPLAIN LOGIN or PASSWORD as UTF-8 bytes: a long string or byte array, nothing else."""
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (bytes, bytearray)):
        return utf8(bytes(value), f"AMQPLAIN {name}")
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


class Authenticator(AccessControl):
    """
    The broker's L{AccessControl} as AMQP's handshake asks it: the mechanisms
    connection.start offers, start-ok responses and new secrets, each answered
    with a Deferred. The native protocol's server is given the same object.
    """

    def offered_mechanisms(self, transport):
        """
        The mechanisms connection.start offers on C{transport}: EXTERNAL only
        if it carries a client certificate.
        """
        if EXTERNAL in self.mechanisms and peer_certificate(transport) is None:
            return tuple(name for name in self.mechanisms if name != EXTERNAL)
        return self.mechanisms

    def login(self, mechanism, response, peer_host, transport=None):
        """
        A Deferred firing with the user name, or failing with L{LoginRefused}.
        C{transport} gives EXTERNAL the client's certificate.
        """
        if mechanism not in self.mechanisms:
            return defer.fail(LoginRefused(
                f"unsupported authentication mechanism {mechanism!r}; use one of"
                f" {', '.join(self.offered_mechanisms(transport))}"
            ))
        try:
            if mechanism == EXTERNAL:
                return defer.succeed(self.check_certificate_login(peer_host, transport))
            username, password = parse_response(mechanism, response)
            return defer.succeed(
                self.check_password_login(mechanism, username.decode(), password, peer_host)
            )
        except LoginRefused:
            return defer.fail()
