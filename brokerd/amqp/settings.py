"""What an AMQP listener offers its clients and holds them to.

One listener's L{AmqpSettings} go to the L{brokerd.amqp.handshake.AmqpHandshake}
of each of its connections; L{SERVER_CAPABILITIES} are what every
connection.start offers.
"""

from brokerd.access.login import LOGIN_REFUSAL_DELAY
from brokerd.amqp.auth import Authenticator
from brokerd.wire.refusal_log import RefusalLog

DEFAULT_FRAME_MAX = 131072
DEFAULT_CHANNEL_MAX = 2047
DEFAULT_HEARTBEAT = 60
DEFAULT_MAX_MESSAGE_SIZE = 128 * 1024 * 1024
# A client that has not logged in gets its refusal (403 for a wrong password,
# 501/502/503/540 for a bad frame) LOGIN_REFUSAL_DELAY seconds after the fault,
# as a native client refused at hello does (brokerd.access.login).

SERVER_CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
}


class AmqpSettings:
    """What the server offers in connection.tune and enforces after it."""

    def __init__(
        self,
        authenticator=None,
        frame_max=DEFAULT_FRAME_MAX,
        channel_max=DEFAULT_CHANNEL_MAX,
        heartbeat=DEFAULT_HEARTBEAT,
        max_message_size=DEFAULT_MAX_MESSAGE_SIZE,
        refusal_delay=LOGIN_REFUSAL_DELAY,
    ):
        self.authenticator = authenticator or Authenticator()
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = heartbeat
        self.max_message_size = max_message_size
        self.refusal_delay = refusal_delay
        self.refusal_log = RefusalLog()
        # Added to connection.start's server properties: a cluster's node says its cluster
        # (RabbitMQ's cluster_name) and which node serves the connection (brokerd's node).
        self.node_properties = {}
