"""A client connection as the broker sees it, whatever its wire protocol.

Each protocol server makes one L{Connection} per client once the client has
opened it (AMQP's connection.open, the native hello), and the broker lists it
in C{broker.connections} until it closes. It holds what authentication,
permissions and a management API need to know of a client, in the shapes of
RabbitMQ's C{/api/connections}, C{/api/channels} and C{/api/consumers}: the
protocol, the peer and local addresses, the user, the vhost, the client's
properties, its channels and their consumers, byte and message counters, and
when it connected.

It owns the connection's exclusive queues (L{IQueueOwner}); closing it closes
every channel (requeueing their un-acked deliveries) and deletes those queues.

Counting costs the hot path one integer increment: the protocol server adds
each read's and each write's bytes to C{bytes_received} and C{bytes_sent}, and
each channel counts its own messages (L{brokerd.session.channel.Channel.messages_published}
and the others); a connection's message counts add up those of its channels,
the closed ones included.
"""

import itertools

from zope.interface import implementer

from brokerd.errors import InvalidChannel
from brokerd.interfaces import IQueueOwner
from brokerd.session.channel import Channel
from brokerd.session.counters import (
    COUNTERS,
    DELIVERY_COUNTERS,
    MESSAGE_COUNTERS,
    ROUTING_COUNTERS,
    channel_count,
)
from brokerd.wire.tls_details import NO_TLS, tls_details

AMQP_0_9_1 = "AMQP 0-9-1"  # the protocol names RabbitMQ's management API gives
NATIVE = "native"

HANDSHAKE_TIMEOUT = 10.0  # seconds a client has, on either protocol, from connecting until it is in

_connection_numbers = itertools.count(1)


def endpoint(address):
    """
    C{(host, port)} of a Twisted transport address; C{(str(address), None)} for
    one without a port (UNIX).
    """
    if hasattr(address, "port"):
        return address.host, address.port
    return str(address), None


def endpoint_text(endpoint):
    """C{host:port} as RabbitMQ writes it in a connection's name (an IPv6 host in brackets)."""
    host, port = endpoint
    if port is None:
        return host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@implementer(IQueueOwner)
class Connection:
    """
    One client connection.

    @ivar protocol: the wire protocol, L{AMQP_0_9_1} or L{NATIVE} (None for
        a connection made in-process, without one).
    @ivar peer: the client's C{(host, port)}, or None without a transport.
    @ivar local: the broker's C{(host, port)} the client connected to, or None.
    @ivar name: a stable name, as RabbitMQ's: C{"127.0.0.1:54321 -> 127.0.0.1:5672"}.
    @ivar user: the name of the user who logged in, or None (no login).
    @ivar access: that user's L{brokerd.access.permissions.ResourceAccess} on
        the vhost, which its channels check every operation against; None
        for an unchecked internal user (a connection made in-process, without a login).
    @ivar client_name: what the client calls itself (AMQP's connection_name or
        product, the native hello's client name).
    @ivar client_properties: the client properties it sent (a dict; empty for
        the native protocol, which sends a name only).
    @ivar connected_at: when it was opened, in milliseconds since the epoch on
        the broker's clock.
    @ivar bytes_received: bytes read from the client since it was opened.
    @ivar bytes_sent: bytes written to the client since it was opened.
    @ivar channels: channel id -> open L{Channel}.
    @ivar exclusive_queues: the exclusive queues this connection declared.
    @ivar inbound: what the bodies of its uncommitted transactions count
        against: the broker's watermark, or the protocol's
        L{brokerd.wire.connection_memory.ConnectionMemory}, which counts them there too.
    @ivar deliveries_paused: True while the transport's write buffer is full;
        consumers of this connection then get nothing more.
    @ivar limits: what checks its user's channel limit before a channel opens
        (L{brokerd.access.limits.ClientLimits}), or None: no limit.
    """

    def __init__(self, broker, vhost_name, client_name="", protocol=None, transport=None, user=None,
                 client_properties=None, access=None, limits=None, auth_mechanism=None):
        """
        @param transport: the transport the client is connected over, whose
            peer and local addresses name the connection (None in-process),
            and whose TLS, if any, is described in C{tls}.
        @param auth_mechanism: the SASL mechanism the client logged in with
            (C{PLAIN}, C{AMQPLAIN}, C{EXTERNAL}), for the connection listings.
        """
        self.broker = broker
        # 530 for an unknown vhost or one whose store is down:
        self.vhost = broker.vhost(vhost_name, user)
        self.client_name = client_name
        self.number = next(_connection_numbers)
        self.protocol = protocol
        if transport is not None:
            self.peer, self.local = endpoint(transport.getPeer()), endpoint(transport.getHost())
            self.name = f"{endpoint_text(self.peer)} -> {endpoint_text(self.local)}"
        else:
            self.peer = self.local = None
            self.name = f"in-process connection {self.number}"
        self.tls = tls_details(transport) if transport is not None else dict(NO_TLS)
        self.auth_mechanism = auth_mechanism
        self.user = user
        self.access = access
        self.limits = limits
        self.client_properties = dict(client_properties or {})
        self.tuning = {}  # AMQP's channel_max, frame_max and timeout (heartbeat) once negotiated
        self.connected_at = int(broker.clock.seconds() * 1000)
        self.bytes_received = 0
        self.bytes_sent = 0
        self.channels = {}
        self.exclusive_queues = set()
        self.closed = False
        # Set by the protocol server: tells the client why the broker closes (close_by_broker).
        self.closer = None
        # Set by the protocol server: closes one channel for an error of the broker's
        # (channel_id, error), as close_channel_by_broker asks.
        self.channel_closer = None
        self.deliveries_paused = False
        self.inbound = broker.watermark
        # Closed channels' totals:
        self._closed_channel_counts = dict.fromkeys(COUNTERS, 0)
        broker.connections.add(self)
        broker.counters.connections_opened += 1

    def __repr__(self):
        return (
            f"<Connection {self.number} {self.name} {self.client_name!r}"
            f" on vhost {self.vhost.name!r}>"
        )

    # -- channels

    def open_channel(self, channel_id, peer):
        """
        Open channel C{channel_id}; it is a connection error if it is open
        already (504) or its user is at its channel limit (530).
        """
        if channel_id in self.channels:
            raise InvalidChannel(f"channel {channel_id} is already open")
        if self.limits is not None and self.user is not None:
            self.limits.check_channel(self.user, self.broker.connections)
        channel = self.channels[channel_id] = Channel(self, channel_id, peer)
        self.broker.counters.channels_opened += 1
        return channel

    def channel(self, channel_id):
        """The open channel C{channel_id}; a connection error (504) if there is none."""
        channel = self.channels.get(channel_id)
        if channel is None:
            raise InvalidChannel(f"channel {channel_id} is not open")
        return channel

    def close_channel(self, channel_id):
        """Close a channel if it is open (its message counts stay in the connection's)."""
        channel = self.channels.pop(channel_id, None)
        if channel is not None:
            channel.close()
            self.broker.counters.channels_closed += 1
            counts = self._closed_channel_counts
            for counter in counts:
                counts[counter] += channel_count(channel, counter)

    def consumers(self):
        """
        Every consumer of this connection's open channels, channel by channel
        in the order they started.
        """
        return [
            consumer
            for channel in self.channels.values()
            for consumer in channel.consumers.values()
        ]

    # -- counters

    def message_counts(self):
        """
        The connection's message counters, its open and closed channels' added
        up: a dict with C{messages_published}, C{messages_delivered} (to
        consumers and basic.get), C{messages_redelivered} (of those, the ones
        flagged redelivered) and C{messages_acked}.
        """
        return self._counts(MESSAGE_COUNTERS)

    def routing_counts(self):
        """
        The connection's other counters (L{brokerd.session.counters.ROUTING_COUNTERS}),
        open and closed channels added up: unroutable publishes dropped and
        returned, publishes made and confirmed in confirm mode.
        """
        return self._counts(ROUTING_COUNTERS)

    def delivery_counts(self):
        """
        How the connection's deliveries went out (L{brokerd.session.counters.DELIVERY_COUNTERS}),
        open and closed channels added up: to consumers with and without acks, by basic.get
        with and without, and the basic.gets that found nothing.
        """
        return self._counts(DELIVERY_COUNTERS)

    def _counts(self, counters):
        """
        C{counters} (names of channel counters) -> the closed channels' totals
        and the open ones' added up.
        """
        closed = self._closed_channel_counts
        counts = {counter: closed[counter] for counter in counters}
        for channel in self.channels.values():
            for counter in counters:
                counts[counter] += channel_count(channel, counter)
        return counts

    @property
    def messages_published(self):
        return self.message_counts()["messages_published"]

    @property
    def messages_delivered(self):
        return self.message_counts()["messages_delivered"]

    @property
    def messages_redelivered(self):
        return self.message_counts()["messages_redelivered"]

    @property
    def messages_acked(self):
        return self.message_counts()["messages_acked"]

    # -- IQueueOwner

    def own(self, queue):
        """C{queue} was declared exclusive on this connection: it goes when the connection does."""
        self.exclusive_queues.add(queue)

    def disown(self, queue):
        """C{queue} was deleted before the connection closed."""
        self.exclusive_queues.discard(queue)

    # -- flow and closing

    def held_bytes(self):
        """Body bytes this connection's channels hold for transactions not yet committed."""
        return sum(channel.transaction_bytes for channel in self.channels.values())

    def pause_deliveries(self):
        """The client is not reading fast enough: hold deliveries back until it catches up."""
        self.deliveries_paused = True

    def resume_deliveries(self):
        """The client caught up: deliver again to every consumer of this connection."""
        if not self.deliveries_paused:
            return
        self.deliveries_paused = False
        for channel in list(self.channels.values()):
            channel.dispatch_all()

    def close_channel_by_broker(self, channel_id, error):
        """
        The broker closes one channel (a delivery on it was not acked in time):
        the protocol server sends C{error} to the client through
        C{channel_closer}, and the channel closes, requeueing its un-acked deliveries.
        """
        if self.channel_closer is not None:
            self.channel_closer(channel_id, error)
        self.close_channel(channel_id)

    def close_by_broker(self, error):
        """
        The broker ends this client's connection (its vhost was deleted, an
        operator asked): the protocol server sends C{error} (a 320
        CONNECTION_FORCED, as RabbitMQ's) to the client through C{closer},
        and the connection closes as with L{close}.
        """
        if self.closer is not None:
            self.closer(error)
        self.close()

    def close(self):
        """Close every channel and delete this connection's exclusive queues."""
        if self.closed:
            return
        self.closed = True
        for channel_id in list(self.channels):
            self.close_channel(channel_id)
        for queue in list(self.exclusive_queues):
            self.vhost.delete_queue(queue.name)
        self.broker.connections.discard(self)
        # Keeps its message counts in the broker's totals.
        self.broker.counters.connection_closed(self)
