"""Paths, JSON and errors of the management API, in RabbitMQ's shapes.

A route is a method set and a path pattern of segments (C{{vhost}} and the
like match one URL-decoded segment, so C{%2F} is the vhost C{/}); a handler
gets the L{ApiRequest} and the matched names and returns what to send as
JSON (None: 204 No Content), or a Deferred of it. Errors are L{ApiError}s
with RabbitMQ's status codes and C{{"error": ..., "reason": ...}} bodies.
"""

import json
from urllib.parse import unquote

from brokerd.errors import AccessRefused, NotAllowed, NotFound

# cowboy_rest's 404, as RabbitMQ sends it
NOT_FOUND_BODY = {"error": "Object Not Found", "reason": "Not Found"}


class ApiError(Exception):
    """An HTTP error answer: C{status} and RabbitMQ's C{{"error", "reason"}} body."""

    def __init__(self, status, error, reason, headers=()):
        super().__init__(f"{status} {error}: {reason}")
        self.status = status
        self.body = {"error": error, "reason": reason}
        self.headers = dict(headers)


class Created:
    """
    A handler's answer for a new object: 201, with a C{Location} header if
    given (RabbitMQ's binding POST).
    """

    def __init__(self, location=None):
        self.location = location


def not_found():
    error = ApiError(404, "", "")
    error.body = dict(NOT_FOUND_BODY)
    return error


def bad_request(reason, error="bad_request"):
    return ApiError(400, error, reason)


def not_authorised(reason):
    """
    401 as RabbitMQ's C{rabbit_web_dispatch_access_control:not_authorised}: the
    client may log in again.
    """
    return ApiError(
        401, "not_authorised", reason, {"WWW-Authenticate": 'Basic realm="RabbitMQ Management"'}
    )


ACCESS_REFUSED = "Access refused."  # rabbit_mgmt_util's reason for a refused permission


def broker_error(problem):
    """
    A broker refusal as RabbitMQ's management API answers one outside a
    channel: 404 as cowboy's, 401 with the refusal's text, else 400 with the
    bare text, without the AMQP code RabbitMQ keeps for channel replies.
    """
    if isinstance(problem, NotFound):
        return not_found()
    if isinstance(problem, (AccessRefused, NotAllowed)):
        return not_authorised(problem.text)
    return bad_request(problem.text)


def direct_refusal(problem):
    """
    A refused declare, delete, bind, unbind or purge as RabbitMQ answers it
    (C{rabbit_mgmt_util:direct_request}): 404 C{not_found} with the bare text,
    401 "Access refused." for a refused permission, else 400 with the bare text.
    """
    if isinstance(problem, NotFound):
        return ApiError(404, "not_found", problem.text)
    if isinstance(problem, (AccessRefused, NotAllowed)):
        return not_authorised(ACCESS_REFUSED)
    return bad_request(problem.text)


def channel_refusal(problem):
    """
    A refused get as RabbitMQ answers it (C{rabbit_mgmt_util:with_channel}):
    the AMQP reply text ("NOT_FOUND - ...") with 404 or 401, else 400 with the
    code in front ("405 RESOURCE_LOCKED - ...").
    """
    if isinstance(problem, NotFound):
        return ApiError(404, "not_found", problem.reply_text)
    if isinstance(problem, AccessRefused):
        return not_authorised(problem.reply_text)
    if isinstance(problem, NotAllowed):
        return not_authorised(ACCESS_REFUSED)
    return bad_request(str(problem))


def publish_refusal(problem):
    """
    A refused publish as RabbitMQ answers it (its channel closed under it):
    400 with the code in front, whatever the refusal ("404 NOT_FOUND - ...").
    """
    return bad_request(str(problem))


class Route:
    """
    C{methods} on the path C{pattern} (e.g. C{"/api/queues/{vhost}/{name}"})
    answered by C{handler}; a listing's items sort by C{sort} keys by default.
    """

    def __init__(self, methods, pattern, handler, sort=("vhost", "name")):
        self.methods = frozenset(methods.split())
        self.segments = pattern.strip("/").split("/")
        self.handler = handler
        self.sort = sort

    def match(self, segments):
        """The names the pattern's C{{...}} segments matched, or None."""
        if len(segments) != len(self.segments):
            return None
        names = {}
        for wanted, got in zip(self.segments, segments):
            if wanted.startswith("{"):
                names[wanted[1:-1]] = got
            elif wanted != got:
                return None
        return names


class Router:
    """The API's routes, looked up by decoded path segments."""

    def __init__(self, routes):
        self.routes = list(routes)

    def find(self, method, raw_path):
        """
        C{(route, names)}; raises L{ApiError} 404 for an unknown path, 405 for
        a method it does not take.
        """
        segments = [unquote(segment) for segment in raw_path.split("?", 1)[0].strip("/").split("/")]
        allowed = set()
        for route in self.routes:
            names = route.match(segments)
            if names is None:
                continue
            if method in route.methods:
                return route, names
            allowed |= route.methods
        if allowed:
            raise ApiError(405, "method_not_allowed", f"{method} is not allowed here",
                           {"Allow": ", ".join(sorted(allowed))})
        raise not_found()


def json_body(request):
    """
    The request body decoded as a JSON object (an empty body is C{{}}), or 400
    as RabbitMQ's C{decode}.
    """
    raw = request.content.read() if request.content is not None else b""
    if raw.strip() in (b"", b"null", b"undefined"):
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise bad_request("not_json") from None
    if isinstance(value, str):
        raise bad_request("invalid payload: the request body JSON-decoded to a string."
                          " Is the input doubly-JSON-encoded?")
    if not isinstance(value, dict):
        raise bad_request("not_json")
    return value


class RawJson:
    """An answer already encoded as JSON text (a long listing built from cached parts)."""

    def __init__(self, text):
        self.text = text


def encode(value):
    """JSON bytes for an answer; bytes inside (AMQP table values) become text."""
    if isinstance(value, RawJson):
        return value.text.encode("utf-8")
    return json.dumps(value, default=_jsonable).encode("utf-8")


def encode_text(value):
    """L{encode} as text, for parts of a L{RawJson} answer."""
    return json.dumps(value, default=_jsonable)


def _jsonable(value):
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def parse_bool(value, default=False):
    """A JSON or query-string boolean as RabbitMQ's C{rabbit_misc:parse_bool} reads it."""
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    text = str(value).lower()
    if text == "true":
        return True
    if text == "false":
        return False
    raise bad_request(f"{value!r} is not a boolean")


def query_value(request, name):
    """The first value of query parameter C{name} as text, or None."""
    values = request.args.get(name.encode())
    return values[0].decode("utf-8", "replace") if values else None
