"""C{/api/connections}, C{/api/channels} and C{/api/consumers}: who is
connected, in RabbitMQ's shapes.

As RabbitMQ's C{is_authorized_user}: monitoring and administrator users see
every client of the vhosts they see, the others their own connections only.
DELETE on a connection closes it with 320 CONNECTION_FORCED and the reason
of the C{X-Reason} header ("Closed via management plugin" by default).
"""

from brokerd.errors import ConnectionForced
from brokerd.http.routes import not_authorised, not_found

DEFAULT_CLOSE_REASON = "Closed via management plugin"


def _connections(api, vhost=None):
    visible = set(api.visible_vhosts()) if vhost is None else {api.vhost_named(vhost)}
    found = [connection for connection in api.context.broker.connections
             if connection.vhost.name in visible and connection.protocol is not None
             and (api.is_monitor or connection.user == api.user)]
    return sorted(found, key=lambda connection: connection.name)


def connection_info(api, connection):
    peer_host, peer_port = connection.peer or (None, None)
    host, port = connection.local or (None, None)
    counts = connection.message_counts()
    info = {
        "name": connection.name,
        "node": api.context.node,
        "type": "network",
        "state": "running",
        "user": connection.user,
        "user_who_performed_action": connection.user,
        "vhost": connection.vhost.name,
        "protocol": connection.protocol,
        "peer_host": peer_host,
        "peer_port": peer_port,
        "host": host,
        "port": port,
        "channels": len(connection.channels),
        "client_properties": connection.client_properties,
        "recv_oct": connection.bytes_received,
        "send_oct": connection.bytes_sent,
        "connected_at": connection.connected_at,
        **connection.tls,
        "auth_mechanism": connection.auth_mechanism,
        "message_counts": counts,
        **connection.tuning,
    }
    # As RabbitMQ: the client's connection_name property, when it gave one as a string.
    provided = connection.client_properties.get("connection_name")
    if isinstance(provided, str):
        info["user_provided_name"] = provided
    return info


def list_connections(api, vhost=None):
    return [connection_info(api, connection) for connection in _connections(api, vhost)]


def _connection(api, name):
    for connection in api.context.broker.connections:
        if connection.name == name and connection.protocol is not None:
            if not (api.is_monitor or connection.user == api.user):
                raise not_authorised("User not authorised to access object")
            if connection.vhost.name not in api.visible_vhosts():
                raise not_authorised("User not authorised to access object")
            return connection
    raise not_found()


def get_connection(api, name):
    """
    One connection; as RabbitMQ 3.10, its TLS details are empty strings where
    the listing has null (no TLS, or no client certificate).
    """
    info = connection_info(api, _connection(api, name))
    for key, value in info.items():
        if value is None and key.startswith(("ssl_", "peer_cert_")):
            info[key] = ""
    return info


def close_connection(api, name):
    connection = _connection(api, name)
    if connection.user != api.user and not api.is_administrator:
        # Monitors may close their own only.
        raise not_authorised("User not authorised to access object")
    reason = api.request.getHeader("x-reason") or DEFAULT_CLOSE_REASON
    connection.close_by_broker(ConnectionForced(reason))


def channel_info(api, channel):
    connection = channel.connection
    transaction = channel.transaction
    return {
        "name": channel.name,
        "number": channel.id,
        "node": api.context.node,
        "state": "running" if channel.flow_active else "flow",
        "user": connection.user,
        "user_who_performed_action": connection.user,
        "vhost": connection.vhost.name,
        "confirm": channel.in_confirm_mode,
        "transactional": transaction is not None,
        "messages_unconfirmed": channel.messages_received_confirm - channel.messages_confirmed,
        "messages_uncommitted": transaction.held_publishes if transaction is not None else 0,
        "acks_uncommitted": transaction.held_settlements if transaction is not None else 0,
        "pending_raft_commands": 0,
        "connection_details": {
            "name": connection.name,
            "peer_host": (connection.peer or (None,))[0],
            "peer_port": (connection.peer or (None, None))[1],
        },
        "consumer_count": len(channel.consumers),
        "messages_unacknowledged": channel.unacked_count,
        "prefetch_count": channel.consumer_prefetch,
        "global_prefetch_count": channel.prefetch_count,
        "message_stats": {
            "publish": channel.messages_published, "deliver_get": channel.messages_delivered,
            "redeliver": channel.messages_redelivered, "ack": channel.messages_acked,
        },
    }


def list_channels(api, vhost=None):
    return [channel_info(api, channel) for connection in _connections(api, vhost)
            for channel in sorted(connection.channels.values(), key=lambda channel: channel.id)]


def get_channel(api, name):
    for connection in _connections(api):
        for channel in connection.channels.values():
            if channel.name == name:
                return channel_info(api, channel)
    raise not_found()


def consumer_info(api, consumer):
    channel = consumer.channel
    return {
        "queue": {"name": consumer.queue.name, "vhost": consumer.queue.vhost.name},
        "consumer_tag": consumer.tag,
        "channel_details": {"name": channel.name, "number": channel.id,
                            "connection_name": channel.connection.name,
                            "peer_host": (channel.connection.peer or (None,))[0],
                            "peer_port": (channel.connection.peer or (None, None))[1],
                            "user": channel.connection.user, "node": api.context.node},
        "ack_required": not consumer.no_ack,
        "exclusive": consumer.exclusive,
        "prefetch_count": consumer.prefetch,
        "active": True,
        "activity_status": "up",
        "arguments": consumer.arguments or {},
    }


def list_consumers(api, vhost=None):
    return [
        consumer_info(api, consumer)
        for connection in _connections(api, vhost)
        for consumer in connection.consumers()
    ]
