"""The management API as C{brokerd-admin} calls it: basic authentication over C{urllib.request}.

An C{https} URL is checked as Python's default TLS context checks it: the
certificate must come from a trusted authority (the system's, or those of
C{--ssl-ca-cert-file}) and name the URL's host, before the credentials go out.

Every failure becomes an L{AdminError} carrying the one line the command prints:
an HTTP error as C{HTTP 401 not_authorised - Login failed} (the status and the
API's C{error} and C{reason}), an unreachable broker as a line naming the URL.
"""

import base64
import json
import ssl
import urllib.error
import urllib.request
from urllib.parse import quote

TIMEOUT_SECONDS = 30
NOT_FOUND = 404


class AdminError(Exception):
    """A request that did not do what it asked; C{str()} is the line to print.

    @ivar status: the HTTP status the API answered with, None when it did not answer.
    """

    def __init__(self, line, status=None):
        super().__init__(line)
        self.status = status


def segment(name):
    """
    A path segment as RabbitMQ's clients write it: every reserved character
    encoded (C{/} is C{%2F}).
    """
    return quote(name, safe="")


def _http_error_line(error):
    """
    C{HTTP STATUS error - reason} from the API's JSON error body, or the status
    line without one.
    """
    try:
        body = json.loads(error.read() or b"null")
    except ValueError:
        body = None
    if isinstance(body, dict) and ("error" in body or "reason" in body):
        return f"HTTP {error.code} {body.get('error', '')} - {body.get('reason', '')}"
    return f"HTTP {error.code} {error.reason}"


class ManagementClient:
    """
    Requests to one broker's management API (C{url}, e.g.
    C{http://127.0.0.1:15672}) as one user.
    """

    def __init__(self, url, user, password, ca_file=None):
        """
        @param ca_file: a PEM file of the authorities an C{https} URL's
            certificate must come from (None: the system's); either way the
            certificate must name the URL's host, or nothing is sent.
        """
        self.url = url.rstrip("/")
        credentials = base64.b64encode(f"{user}:{password}".encode()).decode()
        self._authorization = f"Basic {credentials}"
        self._tls = None
        if ca_file is not None:
            try:
                self._tls = ssl.create_default_context(cafile=ca_file)
            except ssl.SSLError:  # an OSError too: first
                raise AdminError(
                    f"--ssl-ca-cert-file: {ca_file!r} holds no PEM certificate"
                ) from None
            except OSError as error:
                raise AdminError(
                    f"--ssl-ca-cert-file: cannot read {ca_file!r}: {error.strerror or error}"
                ) from None

    def request(self, method, path, body=None, headers=None):
        """The answer's body as bytes (empty for 204); raises L{AdminError}."""
        request = urllib.request.Request(self.url + path, data=body, method=method)
        request.add_header("Authorization", self._authorization)
        if body is not None:
            request.add_header("Content-Type", "application/json")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS,
                                        context=self._tls) as response:
                return response.read()
        except urllib.error.HTTPError as error:
            raise AdminError(_http_error_line(error), error.code) from None
        except urllib.error.URLError as error:
            raise AdminError(
                f"could not reach the broker's management API at {self.url}: {error.reason}"
            ) from None
        except (OSError, ValueError) as error:  # a reset or timeout mid-answer; a malformed --url
            raise AdminError(
                f"could not talk to the broker's management API at {self.url}: {error}"
            ) from None

    def get_json(self, path):
        """The decoded JSON answer of C{GET path}, and its text as the API sent it."""
        raw = self.request("GET", path)
        try:
            return json.loads(raw), raw.decode("utf-8")
        except ValueError:
            raise AdminError(f"{self.url}{path} did not answer JSON") from None

    def get_json_if_any(self, path):
        """
        The decoded JSON answer of C{GET path}, or None when the API answers
        404 (no such object).
        """
        try:
            return self.get_json(path)[0]
        except AdminError as error:
            if error.status == NOT_FOUND:
                return None
            raise

    def send_json(self, method, path, document):
        """C{method} (PUT, POST) with C{document} as the JSON body; the answer's body as bytes."""
        return self.request(method, path, body=json.dumps(document).encode("utf-8"))
