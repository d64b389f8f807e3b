"""
The HTTP side of etcd's v3 JSON gateway: which endpoints to talk to (and how: TLS with name and
chain checks, plain HTTP only on loopback), and answers read with a bound, so a hostile or broken
peer can neither flood the node's memory nor hang it. JSON meaning is L{etcd}'s and L{watch}'s.
"""

import ipaddress
from io import BytesIO
from urllib.parse import urlsplit

from twisted.internet import defer, error, protocol, ssl
from twisted.web.client import Agent, FileBodyProducer, HTTPConnectionPool, ResponseDone
from twisted.web.client import _HTTP11ClientFactory
from twisted.web.http import PotentialDataLoss
from twisted.web.http_headers import Headers
from twisted.web.iweb import UNKNOWN_LENGTH, IPolicyForHTTPS
from zope.interface import implementer

from brokerd.cluster.errors import EtcdUnavailable, MalformedResponse

DEFAULT_PORT = 2379
# Failures before any byte of the request reached a server: trying the next endpoint is safe.
NOT_CONNECTED = (error.ConnectError, error.DNSLookupError, error.TimeoutError)


def is_loopback(host):
    """Whether C{host} names this machine's loopback interface only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_endpoints(urls):
    """
    The base URLs (bytes, without a trailing slash) of C{urls}, a comma-separated string or a
    list; ValueError naming the first that is not C{http://HOST[:PORT]} on loopback or
    C{https://HOST[:PORT]}.
    """
    if isinstance(urls, str):
        urls = [url for url in (part.strip() for part in urls.split(",")) if url]
    if not urls:
        raise ValueError("no etcd endpoint given")
    found = []
    for url in urls:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"etcd endpoint {url!r} is not an http:// or https:// URL with a host")
        if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
            raise ValueError(f"etcd endpoint {url!r} has more than scheme, host and port")
        try:
            port = parts.port or DEFAULT_PORT
        except ValueError:
            raise ValueError(f"etcd endpoint {url!r} has an invalid port") from None
        if parts.scheme == "http" and not is_loopback(parts.hostname):
            raise ValueError(
                f"etcd endpoint {url!r} is plain HTTP off loopback: use https:// so the cluster's "
                "leadership cannot be read or forged on the network"
            )
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        found.append(f"{parts.scheme}://{host}:{port}".encode("ascii"))
    return found


@implementer(IPolicyForHTTPS)
class VerifiedTLS:
    """TLS to etcd with the server's name and chain checked against C{ca_file} (a PEM bundle),
    or against the platform's trust store without one."""

    def __init__(self, ca_file=None):
        if ca_file is None:
            self._trust = None
        else:
            try:
                with open(ca_file, "rb") as pem:
                    blocks = split_pem(pem.read())
                certificates = [ssl.Certificate.loadPEM(block) for block in blocks]
            except (OSError, ValueError, ssl.SSL.Error) as error:
                raise ValueError(f"etcd CA file {ca_file}: {error}") from None
            self._trust = ssl.trustRootFromCertificates(certificates)

    def creatorForNetloc(self, hostname, port):
        return ssl.optionsForClientTLS(hostname.decode("ascii"), trustRoot=self._trust)


def split_pem(data):
    """The PEM certificates of a bundle, each as bytes; ValueError when there is none."""
    marker = b"-----END CERTIFICATE-----"
    blocks = [block + marker for block in data.split(marker) if b"-----BEGIN CERTIFICATE" in block]
    if not blocks:
        raise ValueError("the etcd CA file holds no PEM certificate")
    return blocks


class BoundedBody(protocol.Protocol):
    """
    Collects a response body of at most C{limit} bytes; past it, stops reading and fails with
    L{MalformedResponse}. C{done} fires with the bytes.
    """

    def __init__(self, url, limit, declared):
        self.done = defer.Deferred(canceller=lambda _: self._stop())
        self._url, self._limit, self._declared = url, limit, declared
        self._parts, self._size = [], 0

    def connectionMade(self):
        if self._declared is not UNKNOWN_LENGTH and self._declared > self._limit:
            self._refuse(f"declares {self._declared} bytes")

    def dataReceived(self, data):
        if self.done.called:
            return
        self._size += len(data)
        if self._size > self._limit:
            self._refuse(f"sent more than {self._limit} bytes")
            return
        self._parts.append(data)

    def _stop(self):
        if self.transport is not None:
            self.transport.stopProducing()

    def _refuse(self, what):
        self._stop()
        if not self.done.called:
            self.done.errback(MalformedResponse(
                f"etcd at {self._url.decode()} {what}: over the {self._limit} bytes an answer "
                "may take"
            ))

    def connectionLost(self, reason=protocol.connectionDone):
        if self.done.called:
            return
        if reason.check(ResponseDone, PotentialDataLoss):
            self.done.callback(b"".join(self._parts))
        else:
            self.done.errback(EtcdUnavailable(
                f"etcd at {self._url.decode()} hung up mid-answer: {reason.getErrorMessage()}"
            ))


class QuietClientFactory(_HTTP11ClientFactory):
    """The HTTP client's connection factory without a log line per request: a node talks
    to etcd several times a second."""

    noisy = False


class Gateway:
    """
    POSTs to one of several etcd endpoints, the one that last answered first; a connection
    failure moves on to the next, and a failure after the request went out makes the next
    request start elsewhere (the caller decides whether to retry: a write may have landed).

    @ivar urls: the endpoints' base URLs, as given.
    """

    def __init__(self, reactor, urls, ca_file=None, timeout=5.0):
        self.urls = parse_endpoints(urls)
        self._reactor = reactor
        self._timeout = timeout
        pool = HTTPConnectionPool(reactor, persistent=False)
        pool._factory = QuietClientFactory  # as treq quiets its pool
        self._agent = Agent(reactor, contextFactory=VerifiedTLS(ca_file), connectTimeout=timeout,
                            pool=pool)
        self._first = 0

    @defer.inlineCallbacks
    def request(self, path, body, timeout=None, endpoint=None):
        """
        POSTs C{body} (bytes) to C{path} on the first endpoint that takes the connection (only
        C{endpoint}, one of L{urls}, when given); fires with (url, response), the response's body
        still to read, or L{EtcdUnavailable} naming every endpoint tried and why. C{timeout}
        (default the gateway's) bounds each attempt until the response's headers.
        """
        timeout = self._timeout if timeout is None else timeout
        failures = []
        order = [(self._first + offset) % len(self.urls) for offset in range(len(self.urls))]
        for index in order if endpoint is None else [self.urls.index(endpoint)]:
            url = self.urls[index] + path
            attempt = self._agent.request(
                b"POST", url, Headers({b"content-type": [b"application/json"]}),
                FileBodyProducer(BytesIO(body)),
            )
            timer = self._reactor.callLater(timeout, attempt.cancel) if timeout else None
            try:
                response = yield attempt
            except NOT_CONNECTED as failure:
                failures.append(f"{url.decode()}: {describe_failure(failure)}")
                continue
            except Exception as failure:
                self._first = (index + 1) % len(self.urls)
                if timer is not None and not timer.active():
                    raise EtcdUnavailable(
                        f"etcd at {url.decode()} did not answer within {timeout} s")
                raise EtcdUnavailable(f"etcd at {url.decode()} failed: {describe_failure(failure)}")
            finally:
                if timer is not None and timer.active():
                    timer.cancel()
            self._first = index
            return url, response
        raise EtcdUnavailable("no etcd endpoint answered: " + "; ".join(failures))

    @defer.inlineCallbacks
    def post(self, path, body, limit, timeout=None, endpoint=None):
        """C{request}, then the whole body of at most C{limit} bytes: fires with (url, status,
        body)."""
        url, response = yield self.request(path, body, timeout, endpoint)
        reader = BoundedBody(url, limit, response.length)
        response.deliverBody(reader)
        timeout = self._timeout if timeout is None else timeout
        if timeout:
            reader.done.addTimeout(timeout, self._reactor)
        try:
            data = yield reader.done
        except defer.TimeoutError:
            raise EtcdUnavailable(
                f"etcd at {url.decode()} did not finish its answer in {timeout} s")
        return url, response.code, data


def describe_failure(failure):
    """A short reason for a connection's failure (Twisted's exceptions, or the ones Agent wraps)."""
    reasons = getattr(failure, "reasons", None)
    if reasons:
        return "; ".join(describe_failure(reason.value) for reason in reasons)
    if type(failure).__module__.startswith(("OpenSSL", "service_identity")):
        return f"the TLS check of the server failed: {failure}"
    return str(failure) or type(failure).__name__
