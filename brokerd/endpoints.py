"""Endpoint strings (``tcp:5672:interface=127.0.0.1``) checked before use.

Twisted's parsers fail in many ways (ValueError, KeyError, an ImportError or a
NameError when TLS support is not installed); L{endpoint_problem} turns each
into one sentence a user can act on, so a bad option is one line, not a traceback.
"""

TLS_ENDPOINT_TYPES = ("ssl", "tls")
HIGHEST_PORT = 65535


def tls_installed():
    """True if Twisted's TLS endpoints can work here (they need pyOpenSSL)."""
    try:
        import OpenSSL.SSL  # noqa: F401
    except ImportError:
        return False
    return True


def endpoint_problem(parse, reactor, description):
    """
    What is wrong with endpoint string C{description}, or None if C{parse}
    (C{serverFromString} or C{clientFromString}) accepts it.
    """
    kind, _, rest = description.partition(":")
    if kind.lower() in TLS_ENDPOINT_TYPES and not tls_installed():
        return "TLS support is not installed (pip install 'twisted[tls]')"
    if kind.lower() == "tcp":
        for part in rest.split(":"):
            # The port: the first positional part or port=N (a server endpoint), the second (a client's).
            value = part.partition("=")[2] if part.startswith("port=") else part
            if value.isdigit() and int(value) > HIGHEST_PORT:
                return f"port {value} is outside 0-{HIGHEST_PORT}"
    try:
        parse(reactor, description)
    except Exception as problem:  # noqa: BLE001 - every parser failure is the string's fault
        return str(problem) or type(problem).__name__
    return None
