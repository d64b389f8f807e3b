"""The HTTP management API, compatible with RabbitMQ's management plugin (C{/api/...}).

L{brokerd.http.server} serves it on C{--http} with basic authentication
against the broker's users; L{brokerd.http.routes} maps paths to the
handlers of L{brokerd.http.overview}, L{brokerd.http.accessapi},
L{brokerd.http.topology} and L{brokerd.http.clients}, which work on the
protocol-free model, never through AMQP or the native protocol.
"""
