"""The management API's HTTP server: basic authentication, RabbitMQ's tag rules, JSON answers.

L{ManagementApi} is a C{twisted.web} resource answering every C{/api/...}
path through L{brokerd.http.routes.Router}. Each request logs in with HTTP
basic authentication against the broker's access database, with RabbitMQ's
rules (C{rabbit_web_dispatch_access_control}): guest only from a loopback
address, and only users tagged management, policymaker, monitoring or
administrator may use the API at all (401 C{not_authorised} otherwise).
Monitoring and administrator users see every vhost, the others the vhosts
they have permissions on; changes to users, vhosts and permissions are for
administrators (L{brokerd.access.commands.AccessCommands} checks that).
L{make_site} serves it under C{/api/}, beside the dashboard's page and files
(L{brokerd.http.dashboard}), which need no login.
"""

from twisted.internet import defer
from twisted.logger import Logger
from twisted.web import resource, server

from brokerd.access.login import LOOPBACK_ONLY_USERS, is_loopback
from brokerd.access.permissions import ResourceAccess
from brokerd.errors import BrokerError
from brokerd.http.dashboard import add_dashboard
from brokerd.http.listing import ListingQuery
from brokerd.http.nodename import cluster_node_name, node_name
from brokerd.http.overview import MessageTotals
from brokerd.http.routes import (
    ApiError,
    Created,
    Router,
    broker_error,
    encode,
    not_authorised,
    not_found,
)
from brokerd.http.urls import ROUTES

log = Logger()

MANAGEMENT_TAGS = frozenset({"management", "policymaker", "monitoring", "administrator"})
MONITOR_TAGS = frozenset({"monitoring", "administrator"})
LOGIN_FAILED = "Login failed"
NOT_MANAGEMENT_USER = "Not management user"
LOCALHOST_ONLY = "User can only log in via localhost"
NOT_ADMINISTRATOR = "Not administrator user"
NOT_MONITOR = "Not monitor user"
VHOST_REFUSED = "User not authorised to access virtual host"


class ApiContext:
    """
    What the handlers work with: the broker, its access database and
    management commands, the listeners (for the overview), when it started, and
    the cluster it is a node of (L{brokerd.cluster.status.ClusterStatus}, or None).
    """

    def __init__(
        self, broker, access, management, listeners=(), started_at=None, node=None, cluster=None
    ):
        self.broker = broker
        self.access = access
        self.management = management
        self.listeners = listeners
        self.started_at = started_at if started_at is not None else broker.clock.seconds()
        self.node = node if node is not None else node_name()  # brokerd@host
        # A cluster's node (a brokerd.cluster.status.ClusterStatus) is named after its node
        # name, as its cluster's other nodes list it; None: a node on its own.
        self.cluster = cluster
        if cluster is not None and node is None:
            self.node = cluster_node_name(cluster.node_name)
        self.totals = MessageTotals(broker)


class ApiRequest:
    """One authenticated request: the twisted.web request, the user and what the user may see."""

    def __init__(self, context, request, user):
        self.context = context
        self.request = request
        self.user = user
        self.tag_list = list(context.access.user(user).tags)
        self.tags = frozenset(self.tag_list)

    @property
    def is_administrator(self):
        return "administrator" in self.tags

    @property
    def is_monitor(self):
        return bool(self.tags & MONITOR_TAGS)

    def check_administrator(self):
        if not self.is_administrator:
            raise not_authorised(NOT_ADMINISTRATOR)

    def check_monitor(self):
        if not self.is_monitor:
            raise not_authorised(NOT_MONITOR)

    def visible_vhosts(self):
        """
        The vhosts this user sees, in creation order: all for monitoring users,
        else those it may use.
        """
        access = self.context.access
        if self.is_monitor:
            return list(access.vhosts)
        return [
            name for name in access.vhosts if access.permissions_of(self.user, name) is not None
        ]

    def vhost_named(self, name):
        """
        Vhost C{name} if it exists and this user sees it: 404 if it does not
        exist, 401 if hidden.
        """
        if not self.context.access.vhost_exists(name):
            raise not_found()
        if name not in self.visible_vhosts():
            raise not_authorised(VHOST_REFUSED)
        return name

    def model_vhost(self, name):
        """The running L{brokerd.model.vhost.VirtualHost} of visible vhost C{name}."""
        self.vhost_named(name)
        try:
            return self.context.broker.vhost(name, self.user)
        except BrokerError as problem:
            raise broker_error(problem) from None

    def resource_access(self, name):
        """
        This user's L{ResourceAccess} on vhost C{name}, to change or read its
        resources as over AMQP.
        """
        if not self.context.access.vhost_exists(name):
            raise not_found()
        permissions = self.context.access.permissions_of(self.user, name)
        if permissions is None:
            raise not_authorised(VHOST_REFUSED)
        return ResourceAccess(
            self.user, name, permissions, self.context.access.topic_rules(self.user, name)
        )


class ManagementApi(resource.Resource):
    """Every C{/api/} path: authenticate, route, answer JSON (errors in RabbitMQ's shape)."""

    isLeaf = True

    def __init__(self, context, routes):
        super().__init__()
        self.context = context
        self.router = Router(routes)

    def render(self, request):
        gone = []  # set when the client hangs up before its answer is ready: nothing is sent then
        request.notifyFinish().addErrback(lambda _: gone.append(True))
        d = defer.maybeDeferred(self._answer, request)
        d.addCallbacks(lambda result: self._send(request, gone, *result),
                       lambda failure: self._fail(request, gone, failure))
        return server.NOT_DONE_YET

    def _answer(self, request):
        method = request.method.decode("ascii", "replace")
        path = request.uri.decode("utf-8", "replace")
        if method == "HEAD":
            method = "GET"
        route, names = self.router.find(method, path)
        api_request = ApiRequest(self.context, request, self._login(request))
        d = defer.maybeDeferred(route.handler, api_request, **names)
        listing = ListingQuery.of(request) if method == "GET" else None
        if listing is not None:
            d.addCallback(listing.shape, route.sort)
        return d.addCallback(_status_of)

    def _login(self, request):
        """
        The name of the user the basic credentials name, checked as RabbitMQ's
        management plugin does.
        """
        name = request.getUser().decode("utf-8", "replace")
        password = request.getPassword()
        access = self.context.access
        if not name or not access.check_password(name, password):
            if name:
                access.count_failed_login(name)
            log.warn("HTTP access denied: user '{user}' - {reason}", user=name, reason=LOGIN_FAILED)
            raise not_authorised(LOGIN_FAILED)
        if name in LOOPBACK_ONLY_USERS and not is_loopback(request.getClientAddress().host):
            raise not_authorised(LOCALHOST_ONLY)
        if not set(access.user(name).tags) & MANAGEMENT_TAGS:
            log.warn(
                "HTTP access denied: user '{user}' - {reason}",
                user=name, reason=NOT_MANAGEMENT_USER,
            )
            raise not_authorised(NOT_MANAGEMENT_USER)
        return name

    def _send(self, request, gone, status, body, headers=None):
        if gone or request.finished:
            return
        request.setResponseCode(status)
        request.setHeader(b"cache-control", b"no-cache")
        for name, value in (headers or {}).items():
            request.setHeader(name.encode(), value.encode())
        if body is not None:
            data = encode(body)
            request.setHeader(b"content-type", b"application/json")
            request.setHeader(b"content-length", b"%d" % len(data))  # one plain body, not chunks
            if request.method != b"HEAD":
                request.write(data)
        request.finish()

    def _fail(self, request, gone, failure):
        problem = failure.value
        if isinstance(problem, BrokerError):
            problem = broker_error(problem)
        if not isinstance(problem, ApiError):
            log.failure(
                "management API request {method} {uri} failed", failure, method=request.method,
                uri=request.uri,
            )
            problem = ApiError(
                500, "internal_server_error", failure.getErrorMessage() or failure.type.__name__
            )
        self._send(request, gone, problem.status, problem.body, problem.headers)


def _status_of(body):
    """
    C{(status, body, headers)} of a handler's answer: 200 with JSON, 204 for
    None, 201 for L{Created}.
    """
    if isinstance(body, Created):
        return 201, None, {"Location": body.location} if body.location else {}
    return (200, body, None) if body is not None else (204, None, None)


class ManagementSite(server.Site):
    """
    The management listener's site: one access-log line per request only when
    C{access_log} is true (C{--http-access-log}). Off by default, as RabbitMQ's
    management listener logs no requests unless configured to: an open
    dashboard polls the API every few seconds.
    """

    def __init__(self, root, access_log=False):
        server.Site.__init__(self, root)
        self.access_log = access_log

    def log(self, request):
        if self.access_log:
            server.Site.log(self, request)


def make_site(context, access_log=False):
    """
    The twisted.web site of the management API over L{ApiContext} C{context},
    and of the dashboard; C{access_log}: log a line per request.
    """
    root = resource.Resource()
    add_dashboard(root)
    root.putChild(b"api", ManagementApi(context, ROUTES))
    site = ManagementSite(root, access_log)
    site.displayTracebacks = False
    site.noisy = False
    return site
