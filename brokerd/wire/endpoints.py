"""Endpoint strings (``tcp:5672:interface=127.0.0.1``) checked before use.

Twisted's parsers fail in many ways (ValueError, KeyError, an ImportError or a
NameError when TLS support is not installed); L{endpoint_problem} turns each
into one sentence a user can act on, so a bad option is one line, not a traceback.

L{server_endpoint} builds listeners: Twisted's, except that a TLS one
(C{ssl:5671:privateKey=key.pem:certKey=cert.pem}) is built here, so that its
files are read once with a message naming the parameter and path at fault
(L{TlsFileProblem}), and so that C{caCerts=ca.pem} makes clients present a
certificate from those authorities.
"""

from twisted.python.filepath import FilePath

TLS_ENDPOINT_TYPES = ("ssl", "tls")
HIGHEST_PORT = 65535
TLS_SERVER_PARAMETERS = frozenset(
    {
        "port", "interface", "backlog", "privateKey", "certKey", "extraCertChain", "caCerts",
        "sslmethod", "dhParameters",
    }
)


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
            # The port: the first positional part or port=N (a server endpoint),
            # the second (a client's).
            value = part.partition("=")[2] if part.startswith("port=") else part
            if value.isdigit() and int(value) > HIGHEST_PORT:
                return f"port {value} is outside 0-{HIGHEST_PORT}"
    try:
        parse(reactor, description)
    except TlsFileProblem:
        raise
    except Exception as problem:  # noqa: BLE001 - every parser failure is the string's fault
        return str(problem) or type(problem).__name__
    return None


class TlsFileProblem(ValueError):
    """
    A key, certificate or CA file named in an C{ssl:} endpoint cannot be used;
    the text names the parameter.
    """


def is_tls(description):
    """True if endpoint string C{description} is a TLS one (C{ssl:} or C{tls:})."""
    return description.partition(":")[0].lower() in TLS_ENDPOINT_TYPES


def _read_pem(parameter, path, load):
    """
    What C{load} makes of the PEM file C{path}, or L{TlsFileProblem} naming
    C{parameter} and the path.
    """
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as problem:
        raise TlsFileProblem(f"cannot read {parameter} {path!r}: {problem.strerror}") from None
    try:
        return load(data)
    # pyOpenSSL raises its own Error or ValueError for anything not PEM.
    except Exception:  # noqa: BLE001
        raise TlsFileProblem(f"{parameter} {path!r} is not a PEM file of the right kind") from None


def _tls_server_endpoint(reactor, description):
    """
    An SSL4ServerEndpoint for
    C{ssl:PORT:privateKey=K[:certKey=C][:extraCertChain=F][:caCerts=F]...}.

    Twisted's own parser takes the same parameters except C{caCerts}: a PEM file of
    the certificate authorities a client's certificate must come from. With it a
    client must present such a certificate at the TLS handshake (RabbitMQ's
    C{verify_peer} with C{fail_if_no_peer_cert}); without it none is asked for.
    """
    from OpenSSL import crypto
    from twisted.internet import ssl
    from twisted.internet.endpoints import SSL4ServerEndpoint, _parse

    args, params = _parse(description)
    if len(args) > 2:
        raise ValueError(
            "too many positional parts; use ssl:PORT:privateKey=KEY.pem:certKey=CERT.pem"
        )
    unknown = set(params) - TLS_SERVER_PARAMETERS
    if unknown:
        known = ", ".join(sorted(TLS_SERVER_PARAMETERS))
        raise ValueError(f"unknown parameter {sorted(unknown)[0]!r}; known: {known}")
    port = params.pop("port", args[1] if len(args) > 1 else None)
    if port is None or not str(port).isdigit() or int(port) > HIGHEST_PORT:
        raise ValueError(f"port {port!r} is not a number in 0-{HIGHEST_PORT}")
    key_path = params.get("privateKey", "server.pem")
    cert_path = params.get("certKey", key_path)
    key = _read_pem(
        "privateKey", key_path, lambda data: crypto.load_privatekey(crypto.FILETYPE_PEM, data)
    )
    cert = _read_pem(
        "certKey", cert_path, lambda data: crypto.load_certificate(crypto.FILETYPE_PEM, data)
    )
    options = {}
    if "extraCertChain" in params:
        options["extraCertChain"] = _read_pem(
            "extraCertChain", params["extraCertChain"], _load_certificates
        )
    if "caCerts" in params:
        authorities = _read_pem("caCerts", params["caCerts"], _load_certificates)
        options.update(verify=True, requireCertificate=True, caCerts=authorities)
    if "sslmethod" in params:
        options["method"] = getattr(ssl.SSL, params["sslmethod"])
    if "dhParameters" in params:
        dh_file = FilePath(params["dhParameters"])
        options["dhParameters"] = ssl.DiffieHellmanParameters.fromFile(dh_file)
    try:
        context = ssl.CertificateOptions(privateKey=key, certificate=cert, **options)
        # A key that does not match its certificate fails here, not at the first client.
        context.getContext()
    except Exception as problem:  # noqa: BLE001 - pyOpenSSL's errors are lists of OpenSSL reasons
        raise TlsFileProblem(
            f"privateKey {key_path!r} and certKey {cert_path!r} do not make a TLS server:"
            f" {problem}"
        ) from None
    return SSL4ServerEndpoint(reactor, int(port), context, backlog=int(params.get("backlog", 50)),
                              interface=params.get("interface", ""))


def _load_certificates(data):
    """Every certificate in a PEM file, at least one."""
    from OpenSSL import crypto

    marker = b"-----BEGIN CERTIFICATE-----"
    blocks = [marker + block for block in data.split(marker)[1:]]
    if not blocks:
        raise ValueError("no certificate")
    return [crypto.load_certificate(crypto.FILETYPE_PEM, block) for block in blocks]


def server_endpoint(reactor, description):
    """
    A server endpoint for C{description}: Twisted's, except that
    C{ssl:}/C{tls:} take C{caCerts=}.
    """
    from twisted.internet.endpoints import serverFromString

    if is_tls(description) and tls_installed():
        return _tls_server_endpoint(reactor, description)
    return serverFromString(reactor, description)
