"""What the TLS tests share: a CA made with trustme, the server's PEM files, and client contexts.

The fixtures C{ca} (one authority per module) and C{files} (the server's key and certificate for 127.0.0.1, the CA
as ca.pem and alone in authorities/) are used by importing them.
"""

import ssl

import pytest
import trustme


@pytest.fixture(scope="module")
def ca():
    return trustme.CA()


@pytest.fixture(scope="module")
def files(tmp_path_factory, ca):
    """The server's key, certificate and CA as PEM files, and a directory holding only the CA (for trustRoots)."""
    directory = tmp_path_factory.mktemp("tls")
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.private_key_pem.write_to_path(str(directory / "key.pem"))
    server.cert_chain_pems[0].write_to_path(str(directory / "cert.pem"))
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    (directory / "authorities").mkdir()
    ca.cert_pem.write_to_path(str(directory / "authorities" / "ca.pem"))
    return directory


def client_context(ca, common_name=None):
    """A client TLS context trusting C{ca}, presenting a certificate for C{common_name} if given."""
    context = ssl.create_default_context()
    ca.configure_trust(context)
    if common_name is not None:
        ca.issue_cert(common_name, common_name=common_name).configure_cert(context)
    return context
