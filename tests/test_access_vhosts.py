"""Creating and deleting vhosts on a broker in-process: a deleted vhost takes
its queues, messages and exchanges (from the store too) and its permissions."""

import pytest
from twisted.internet.task import Clock

from backends.memory.store import MemoryStore
from brokerd.access.database import AccessChangeRefused, AccessDatabase
from brokerd.access.vhosts import add_vhost, delete_vhost
from brokerd.connection import Connection
from brokerd.errors import NotAllowed
from brokerd.model.broker import Broker


def test_a_created_vhost_is_served_and_a_deleted_one_takes_everything_with_it():
    store = MemoryStore()
    store.open()
    broker = Broker(store, Clock())
    access = AccessDatabase.in_memory()
    vhost = add_vhost(broker, access, "team")
    assert sorted(vhost.exchanges) == ["", "amq.direct", "amq.fanout", "amq.headers", "amq.match", "amq.topic"]
    access.set_permissions("guest", "team", ".*", ".*", ".*")
    with pytest.raises(AccessChangeRefused):
        add_vhost(broker, access, "team")
    channel = Connection(broker, "team").open_channel(1, None)
    channel.queue_declare("jobs", durable=True)
    channel.exchange_declare("events", "fanout", durable=True)
    channel.queue_bind("jobs", "events")
    assert [record.name for record in store.topology() if hasattr(record, "name")] == ["events", "jobs"]

    assert delete_vhost(broker, access, "team") == 1
    assert list(store.topology()) == []
    assert not access.vhost_exists("team") and access.permissions_of("guest", "team") is None
    assert channel.closed
    with pytest.raises(NotAllowed, match="vhost team not found"):
        broker.vhost("team")
    with pytest.raises(AccessChangeRefused, match="no vhost 'team'"):
        delete_vhost(broker, access, "team")
