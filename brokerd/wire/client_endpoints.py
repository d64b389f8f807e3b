"""Client endpoint strings that check who they talk to before saying anything.

A client's first frame carries its user name and password, so a TLS client
must know that the server is the broker it meant before sending it. Twisted's
C{tls:HOST:PORT[:trustRoots=DIR]} client endpoint checks both the chain (from
the certificate authorities in C{trustRoots}, else the system's) and that the
certificate names C{HOST}; its older C{ssl:} client endpoint checks no name,
and without C{caCertsDir} no chain either, so any server on the path, holding
any certificate, is sent the credentials. L{client_endpoint} refuses C{ssl:}
unless the caller opted out of verification knowingly (L{UnverifiedTLS} says
what to write instead); L{unverified_warning} is the line to print then.
"""

from twisted.internet.endpoints import clientFromString

UNVERIFIED_TYPES = ("ssl",)


class UnverifiedTLS(ValueError):
    """
    An endpoint string that would talk TLS without checking the server's
    name; the text says why and what to use.
    """


def is_unverified_tls(description):
    """True if client endpoint string C{description} is TLS that checks no server name."""
    return description.partition(":")[0].strip().lower() in UNVERIFIED_TYPES


def unverified_problem(description):
    """The sentence refusing C{description} (an C{ssl:} client string), naming the safe form."""
    return (
        f"{description!r} does not check the broker's name (Twisted's ssl: client endpoint"
        " checks no host name, and nothing at all without caCertsDir), so any server on the"
        " way would be sent the password; use tls:HOST:PORT:trustRoots=CA_DIR, which checks"
        " both, or accept the risk with --insecure-skip-verify"
    )


def unverified_warning(description):
    """The warning line for an C{ssl:} client string used with verification knowingly skipped."""
    return (
        f"warning: --insecure-skip-verify: connecting with {description!r} without checking"
        " the broker's name: whoever answers at that address receives the password"
    )


def client_endpoint(reactor, description, insecure_skip_verify=False):
    """
    A client endpoint for C{description} (Twisted's strings: C{tcp:}, C{unix:},
    C{tls:}); an C{ssl:} one only with C{insecure_skip_verify}, else
    L{UnverifiedTLS}.
    """
    if is_unverified_tls(description) and not insecure_skip_verify:
        raise UnverifiedTLS(unverified_problem(description))
    return clientFromString(reactor, description)
