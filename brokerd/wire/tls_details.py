"""What a client's connection says of its TLS, in the words RabbitMQ 3.10's connection listings use.

RabbitMQ's C{rabbit_reader} gives every connection C{ssl} (a boolean) and
C{ssl_protocol}, C{ssl_key_exchange}, C{ssl_cipher}, C{ssl_hash} (the
negotiated suite as Erlang's C{ssl} names it: C{tlsv1.3}, C{any},
C{aes_256_gcm}, C{aead}) and C{peer_cert_subject}, C{peer_cert_issuer},
C{peer_cert_validity} (RFC 4514 names, the last RDN first, and
C{"2024-01-01T00:00:00Z - 2025-01-01T00:00:00Z"}); all null without TLS or
without a client certificate. L{tls_details} reads them once from a Twisted
transport: pyOpenSSL tells the protocol version and the suite's OpenSSL name,
which L{cipher_suite} splits into Erlang's parts.
"""

NO_TLS = {
    "ssl": False,
    "ssl_protocol": None,
    "ssl_key_exchange": None,
    "ssl_cipher": None,
    "ssl_hash": None,
    "peer_cert_subject": None,
    "peer_cert_issuer": None,
    "peer_cert_validity": None,
}

# OpenSSL's short names of the attributes RabbitMQ names, and its names for them.
ATTRIBUTE_NAMES = {
    "SN": "SN", "GN": "GIVENNAME", "initials": "INITIALS",
    "generationQualifier": "GENERATIONQUALIFIER", "CN": "CN", "L": "L", "ST": "ST", "O": "O",
    "OU": "OU", "title": "TITLE", "C": "C", "serialNumber": "SERIALNUMBER",
    "pseudonym": "PSEUDONYM", "DC": "DC", "emailAddress": "EMAILADDRESS", "street": "STREET",
    "UID": "UID",
}
# Key exchanges as the first words of an OpenSSL (TLS 1.2 and older) suite name.
KEY_EXCHANGES = {
    ("ECDHE", "RSA"): "ecdhe_rsa", ("ECDHE", "ECDSA"): "ecdhe_ecdsa", ("DHE", "RSA"): "dhe_rsa",
    ("DHE", "DSS"): "dhe_dss", ("ECDH", "RSA"): "ecdh_rsa", ("ECDH", "ECDSA"): "ecdh_ecdsa",
    ("ECDHE", "PSK"): "ecdhe_psk", ("DHE", "PSK"): "dhe_psk", ("RSA", "PSK"): "rsa_psk",
    ("PSK",): "psk", ("SRP",): "srp_anon",
}
AEAD_MODES = ("GCM", "CCM", "CCM8", "POLY1305")


def tls_details(transport):
    """
    RabbitMQ's TLS fields of the connection on C{transport} (see the module's
    docstring): L{NO_TLS} unless Twisted's TLS carries it (its handle is a
    pyOpenSSL connection) and the handshake is done.
    """
    get_handle = getattr(transport, "getHandle", None)
    handle = get_handle() if get_handle is not None else None
    try:
        protocol = handle.get_protocol_version_name()
        suite = handle.get_cipher_name()
    except AttributeError:  # a socket, not a pyOpenSSL connection: no TLS
        return dict(NO_TLS)
    if suite is None:  # no handshake yet
        return dict(NO_TLS)
    key_exchange, cipher, mac = cipher_suite(suite)
    details = {
        "ssl": True,
        "ssl_protocol": protocol.lower(),
        "ssl_key_exchange": key_exchange,
        "ssl_cipher": cipher,
        "ssl_hash": mac,
        "peer_cert_subject": None,
        "peer_cert_issuer": None,
        "peer_cert_validity": None,
    }
    certificate = transport.getPeerCertificate()
    if certificate is not None:
        details["peer_cert_subject"] = distinguished_name(certificate.get_subject())
        details["peer_cert_issuer"] = distinguished_name(certificate.get_issuer())
        details["peer_cert_validity"] = (
            f"{asn1_time(certificate.get_notBefore())} - {asn1_time(certificate.get_notAfter())}"
        )
    return details


def cipher_suite(name):
    """
    C{(key exchange, cipher, hash)} of the suite OpenSSL calls C{name}, as
    Erlang's C{ssl} names them (C{"ECDHE-RSA-AES256-GCM-SHA384"} is
    C{("ecdhe_rsa", "aes_256_gcm", "aead")}; TLS 1.3's suites have key
    exchange C{any}).
    """
    if name.startswith("TLS_"):  # TLS 1.3: TLS_AES_256_GCM_SHA384, TLS_CHACHA20_POLY1305_SHA256
        return "any", name[4:].rsplit("_", 1)[0].lower(), "aead"
    words = name.split("-")
    key_exchange = "rsa"
    for prefix, erlang_name in KEY_EXCHANGES.items():
        if tuple(words[:len(prefix)]) == prefix:
            key_exchange, words = erlang_name, words[len(prefix):]
            break
    if any(word in AEAD_MODES for word in words):  # its last word, if SHA..., is the PRF's
        mac, words = "aead", [word for word in words if not word.startswith("SHA")]
    elif len(words) > 1 and words[-1].startswith(("SHA", "MD5")):
        mac, words = words[-1].lower(), words[:-1]
    else:
        mac = None
    return key_exchange, _cipher(words), mac


def _cipher(words):
    """Erlang's name of a cipher from OpenSSL's words: AES128 GCM is aes_128_gcm."""
    if not words:
        return None
    first, rest = words[0], [word.lower() for word in words[1:]]
    if words == ["DES", "CBC3"]:
        return "3des_ede_cbc"
    for family in ("AES", "CAMELLIA", "ARIA"):
        if first.startswith(family) and first[len(family):].isdigit():
            bits = first[len(family):]
            mode = ["ccm_8"] if rest == ["ccm8"] else rest or ["cbc"]
            return "_".join([family.lower(), bits, *mode])
    return "_".join([first.lower(), *rest])


def distinguished_name(name):
    """An X509Name as RabbitMQ's C{rabbit_cert_info} writes it: RFC 4514, the last RDN first."""
    parts = []
    for attribute, value in reversed(name.get_components()):
        short_name = attribute.decode("ascii", "replace")
        parts.append(f"{ATTRIBUTE_NAMES.get(short_name, short_name)}={escaped(value)}")
    return ",".join(parts)


def escaped(value):
    """
    An attribute's value (UTF-8 bytes) escaped as RabbitMQ escapes it: RFC
    4514's specials with a backslash, every byte outside printable ASCII as
    C{\\XX}.
    """
    out = []
    last = len(value) - 1
    for index, byte in enumerate(value):
        char = chr(byte)
        if (index == 0 and char in " #") or (index == last and char == " ") or char in '"+,;<>\\':
            out.append("\\" + char)
        elif byte < 32 or byte >= 126:
            out.append(f"\\{byte:02X}")
        else:
            out.append(char)
    return "".join(out)


def asn1_time(stamp):
    """C{b"20240101000000Z"} (pyOpenSSL's notBefore) as RabbitMQ writes it: 2024-01-01T00:00:00Z."""
    text = stamp.decode("ascii", "replace") if stamp else ""
    if len(text) != 15 or not text[:14].isdigit():
        return text
    return f"{text[0:4]}-{text[4:6]}-{text[6:8]}T{text[8:10]}:{text[10:12]}:{text[12:14]}Z"
