"""A client connection as the broker sees it, whatever its wire protocol.

It owns the connection's channels and exclusive queues; closing it closes every
channel (requeueing their un-acked deliveries) and deletes the exclusive queues.
"""

import itertools

from brokerd.channel import Channel
from brokerd.errors import InvalidChannel

_connection_numbers = itertools.count(1)


class Connection:
    """
    @ivar exclusive_queues: the exclusive queues this connection declared.
    @ivar deliveries_paused: True while the transport's write buffer is full;
        consumers of this connection then get nothing more.
    """

    def __init__(self, broker, vhost_name, client_name=""):
        self.broker = broker
        self.vhost = broker.vhost(vhost_name)
        self.client_name = client_name
        self.number = next(_connection_numbers)
        self.channels = {}
        self.exclusive_queues = set()
        self.closed = False
        self.deliveries_paused = False
        broker.connections.add(self)

    def __repr__(self):
        return f"<Connection {self.number} {self.client_name!r} on vhost {self.vhost.name!r}>"

    def open_channel(self, channel_id, peer):
        """Open channel C{channel_id}; it is a connection error (504) if it is open already."""
        if channel_id in self.channels:
            raise InvalidChannel(f"channel {channel_id} is already open")
        channel = self.channels[channel_id] = Channel(self, channel_id, peer)
        return channel

    def channel(self, channel_id):
        """The open channel C{channel_id}; a connection error (504) if there is none."""
        channel = self.channels.get(channel_id)
        if channel is None:
            raise InvalidChannel(f"channel {channel_id} is not open")
        return channel

    def close_channel(self, channel_id):
        """Close a channel if it is open."""
        channel = self.channels.pop(channel_id, None)
        if channel is not None:
            channel.close()

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
