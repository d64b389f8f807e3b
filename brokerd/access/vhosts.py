"""Creating and deleting vhosts: the access database and the running broker together.

A vhost is created in the access database first (durably), then served; a
deleted one goes from the database first, then its clients are told so (320
CONNECTION_FORCED, "vhost 'x' is deleted", as RabbitMQ) and their connections closed, and
its queues (with their messages) and exchanges are deleted from the store.
"""

from brokerd.access.database import AccessChangeRefused
from brokerd.errors import ConnectionForced


def add_vhost(broker, access, name):
    """Create vhost C{name} (with the C{amq.*} exchanges) and serve it; raises AccessChangeRefused if it exists."""
    access.add_vhost(name)
    return broker.add_vhost(name)


def delete_vhost(broker, access, name):
    """
    Delete vhost C{name} with everything in it; returns how many queues went.
    Raises AccessChangeRefused if there is no such vhost.
    """
    if not access.vhost_exists(name):
        raise AccessChangeRefused(f"no vhost '{name}'")
    access.delete_vhost(name)
    vhost = broker.vhosts.pop(name, None)
    if vhost is None:
        return 0
    deleted = ConnectionForced(f"vhost '{name}' is deleted")  # RabbitMQ's words (rabbit_connection_tracking)
    for connection in [connection for connection in broker.connections if connection.vhost is vhost]:
        connection.close_by_broker(deleted)
    queues = list(vhost.queues)
    for queue in queues:
        vhost.delete_queue(queue)
    for exchange in [exchange for exchange in vhost.exchanges if exchange and not exchange.startswith("amq.")]:
        vhost.delete_exchange(exchange)
    return len(queues)
