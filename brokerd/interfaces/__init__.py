"""The contracts between brokerd's layers.

Protocol adapters sit on top of L{brokerd.model} and L{brokerd.session.channel}; the model
reaches storage only through L{IMessageStore}, and every store hands messages
back as one neutral L{MessageRecord}; a storage backend is found by name
through L{IStoreBackend}, and a vhost with a store of its own has it built
and opened by L{IVhostStores}. L{IDelayedMessageStore} is the storage half of
delayed delivery (the C{x-delayed-message} exchange type); a durable store's
commit times, for the metrics, come through L{ITimedCommits}, and what its
failed commits lost through L{ICommitFailures}. L{IChannelPeer} is
what a protocol adapter gives a channel so the channel can push deliveries,
returns and confirms to its client. The model calls up only through named
roles: a queue serves an L{IConsumer}, an exclusive queue belongs to an
L{IQueueOwner} (a connection), and expiry timers call an L{IExpiringQueue}.
Who may log in and do what is asked through the roles of
L{brokerd.access.interfaces}.

The storage contract is defined in L{brokerd.interfaces.stores}, the roles in
L{brokerd.interfaces.roles}; every layer imports them from here.
"""

from brokerd.interfaces.roles import IChannelPeer, IConsumer, IExpiringQueue, IQueueOwner
from brokerd.interfaces.stores import (
    DelayedMessage,
    ICommitFailures,
    IDelayedMessageStore,
    IMessageStore,
    IPagingStore,
    IStoreBackend,
    ITimedCommits,
    IVhostStores,
    MessageRecord,
    QuarantinedRecord,
    SerializedPropertiesMessage,
    StoreCorrupted,
    StoreInUse,
    UnreadableMessage,
)

__all__ = [
    "DelayedMessage",
    "IChannelPeer",
    "ICommitFailures",
    "IConsumer",
    "IDelayedMessageStore",
    "IExpiringQueue",
    "IMessageStore",
    "IPagingStore",
    "IQueueOwner",
    "IStoreBackend",
    "ITimedCommits",
    "IVhostStores",
    "MessageRecord",
    "QuarantinedRecord",
    "SerializedPropertiesMessage",
    "StoreCorrupted",
    "StoreInUse",
    "UnreadableMessage",
]
