"""Creating and deleting vhosts: the access database and the running broker together.

A vhost is created in the access database first (durably), then served; one
created with a backend string gets a store of its own (built and opened
before anything is recorded, so a bad backend string or a store that cannot
open is one clear error and changes nothing). A deleted one goes from the
database first, then its clients are told so (320 CONNECTION_FORCED, "vhost
'x' is deleted", as RabbitMQ) and their connections closed, and its queues
(with their messages) and exchanges are deleted from the store; a store of
its own is closed and its files removed.
"""

from twisted.internet import defer

from brokerd.access.database import AccessChangeRefused
from brokerd.errors import ConnectionForced
from brokerd.storage import registry
from brokerd.storage.vhost_stores import VhostStoreFailed


def add_vhost(broker, access, name, backend=None):
    """
    Create vhost C{name} (with the C{amq.*} exchanges) and serve it; raises
    AccessChangeRefused if it exists. Without C{backend} it is on the broker's
    store and the L{VirtualHost} is returned; with C{backend} (a backend
    string, e.g. C{sqlite} or C{sqlite:path=/srv/team.sqlite}) a Deferred
    fires with it once its own store is open and the vhost recorded, or fails
    with AccessChangeRefused naming the backend string's or the store's fault.
    """
    if backend is None:
        access.add_vhost(name)
        return broker.add_vhost(name)
    access.check_new_vhost(name)
    if broker.vhost_stores is None:
        raise AccessChangeRefused("this broker has no data directory for vhosts' own stores")
    try:
        broker.vhost_stores.make(name, backend)
    except registry.BackendError as problem:  # built only to check it: nothing is opened
        raise AccessChangeRefused(f"--backend {backend!r}: {problem}") from None
    return _add_vhost_with_store(broker, access, name, backend)


@defer.inlineCallbacks
def _add_vhost_with_store(broker, access, name, backend):
    try:
        store = yield broker.vhost_stores.open(name, backend)
    except VhostStoreFailed as failed:
        raise AccessChangeRefused(str(failed)) from None
    try:
        access.add_vhost(name, backend)
    except Exception:
        yield store.close()
        raise
    vhost = broker.add_vhost(name, store)
    # A new store is empty, unless the files of an earlier vhost of that name were left.
    broker.recover(store)
    return vhost


def delete_vhost(broker, access, name):
    """
    Delete vhost C{name} with everything in it; returns how many queues went
    (for a vhost with a store of its own, a Deferred firing with that number
    once the store is closed and its files removed). Raises AccessChangeRefused
    if there is no such vhost.
    """
    if not access.vhost_exists(name):
        raise AccessChangeRefused(f"no vhost '{name}'")
    own_backend = access.vhost_backend(name)
    access.delete_vhost(name)
    vhost, own_store = broker.forget_vhost(name)
    deleted = 0
    if vhost is not None:
        # RabbitMQ's words (rabbit_connection_tracking):
        gone = ConnectionForced(f"vhost '{name}' is deleted")
        connections = [connection for connection in broker.connections if connection.vhost is vhost]
        for connection in connections:
            connection.close_by_broker(gone)
        queues = list(vhost.queues)
        for queue in queues:
            vhost.delete_queue(queue)
        exchanges = [
            exchange for exchange in vhost.exchanges if exchange and not exchange.startswith("amq.")
        ]
        for exchange in exchanges:
            vhost.delete_exchange(exchange)
        deleted = len(queues)
    if own_backend is None:
        return deleted
    # Its store may be down: its files go all the same.
    return _close_and_remove(broker, name, own_store, deleted)


@defer.inlineCallbacks
def _close_and_remove(broker, name, store, deleted):
    if store is not None:
        yield store.close()
    if broker.vhost_stores is not None:
        broker.vhost_stores.remove_files(name)
    return deleted
