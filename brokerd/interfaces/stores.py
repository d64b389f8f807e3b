"""The storage contract (see L{brokerd.interfaces}): what the model asks of a
message store, what a store gives back, how a backend is found by name, and
the stores of vhosts that have one of their own.
"""

from typing import Any, NamedTuple

from zope.interface import Attribute, Interface

from brokerd.proto import messages_pb2


class IMessageStore(Interface):
    """
    Where durable topology and persistent messages live.

    The broker calls a store only for durable things: durable exchanges, queues
    and bindings, and persistent messages routed to durable queues. Queues are
    named by I{queue keys}, C{(vhost, queue_name)} tuples. Writes (C{append},
    C{ack}, topology changes) are buffered and return at once; C{sync} says when
    everything written before it is as safe as the store's durability mode
    promises, which is when a publisher confirm may go out.

    A I{message} passed to C{append} (or C{delay}) is any object with the
    attributes of a L{MessageRecord}: C{exchange}, C{routing_key},
    C{properties}, C{body} and C{published_at}; the model passes its own
    messages as they are, a follower a L{SerializedPropertiesMessage}. Every
    method that gives a message back (C{read}, C{recover},
    L{IPagingStore.load}, C{delayed_after}) gives a L{MessageRecord}; how a
    store encodes it on disk is its own affair.
    """

    name = Attribute("The backend name this store was made by, e.g. C{'memory'}.")
    durable = Attribute("True if what the store holds survives a restart of the broker.")

    def open():
        """
        Open the store and read back what it holds.

        @return: a Deferred that fires with None once C{topology} and
            C{recover} can answer, or fails if the store cannot be used.
        """

    def topology():
        """
        The durable topology found by C{open}.

        @return: an iterable of C{ExchangeRecord}, C{QueueRecord} and
            C{BindingRecord} protobuf messages (of
            C{brokerd.proto.messages_pb2}), exchanges and queues before the
            bindings that refer to them (every exchange before any binding, as
            a binding's destination may be an exchange).
        """

    def recover(queue):
        """
        The un-acked persistent messages of one durable queue found by C{open}.

        @param queue: a queue key.
        @return: an iterable, in queue order, of C{(handle, record, redelivered)}
            where C{record} is a L{MessageRecord} and C{redelivered} says the
            message may have been delivered before the restart.
        @raise StoreCorrupted: if the queue's data is damaged beyond a torn
            tail (which the store truncates and logs at C{open}).
        """

    def save_exchange(record):
        """
        Persist a durable exchange (a C{brokerd.proto.messages_pb2.ExchangeRecord}),
        replacing one of the same name.
        """

    def delete_exchange(vhost, name):
        """
        Forget a durable exchange and every binding whose source or destination
        exchange it is.
        """

    def save_queue(record):
        """
        Persist a durable queue (a C{brokerd.proto.messages_pb2.QueueRecord}),
        replacing one of the same name.
        """

    def delete_queue(queue):
        """Forget a durable queue, its bindings and every message held for it."""

    def save_binding(record):
        """
        Persist a binding (a C{brokerd.proto.messages_pb2.BindingRecord})
        between durable ends: to the queue C{queue} names, or, when
        C{destination_exchange} names one, to that exchange (C{queue} then
        empty). Two bindings are the same when vhost, source, destination,
        routing key and arguments (as a set of fields) are; saving one again is
        not an error.
        """

    def delete_binding(record):
        """
        Forget a binding equal to C{record} (see L{save_binding}); forgetting a
        missing one is not an error.
        """

    def append(message, queues):
        """
        Store one persistent message for one or more durable queues.

        @param message: the message (see the interface's description).
        @param queues: a non-empty sequence of queue keys.
        @return: an opaque I{handle} naming the stored message in C{ack},
            C{read} and C{recover}; the same handle serves every queue.
        """

    def ack(queue, handle):
        """The message C{handle} is done with in C{queue}; it need not come back."""

    def returned(queue, handle, count):
        """
        The message C{handle} came back to C{queue} unacked for the C{count}th
        time (a requeue). Buffered like C{ack}; a durable store keeps the latest
        count so that x-delivery-count and x-delivery-limit hold across a restart.
        """

    def delivery_counts(queue):
        """
        How often each message C{recover} gives for C{queue} had come back
        before the restart: a dict of handle to count, holding only the
        messages that came back at least once.
        """

    def read(handle):
        """
        Read a stored message back.

        @return: a Deferred firing with the message's L{MessageRecord}, or
            failing with KeyError if the handle names nothing held.
        """

    def purge(queue, handles):
        """
        Drop many messages of C{queue} at once (a queue purge): the same as
        acking each handle in C{handles}, which a backend may do in bulk.
        """

    def sync():
        """
        @return: a Deferred that fires once every write made before this call
            is as durable as the store's durability mode promises. Many calls
            share one flush (group commit).
        """

    def close():
        """
        Flush and release files; the store is unusable afterwards.

        @return: a Deferred firing with None when done.
        """

    def stats():
        """
        @return: a dict of figures for metrics (names to numbers), such as
            messages and bytes held.
        """


class IPagingStore(IMessageStore):
    """
    A store that can hand back any message it holds at once, without a
    Deferred (from memory or a mapped file), so the broker need not keep the
    messages of a queue's backlog in memory: it keeps their handles and loads
    each message when it is delivered.
    """

    def recovered_handles(queue):
        """
        The handles C{recover(queue)} would give, in queue order, without
        reading any message; every one may have been delivered before.

        @raise StoreCorrupted: as C{recover} does.
        """

    def load(handle):
        """
        The message C{handle} names, at once: a L{MessageRecord}, or, while
        the store still holds it unwritten, the very object given to
        C{append} (which has the record's attributes), so that a message
        delivered soon after it was published costs no copy.

        @raise KeyError: if the handle names nothing held.
        @raise StoreCorrupted: if the stored message is damaged.
        """


class MessageRecord(NamedTuple):
    """
    A stored message as every store method hands it back (C{read},
    C{recover}, C{load}, and L{DelayedMessage.record}).

    Its properties (a C{brokerd.proto.messages_pb2.BasicProperties}) are
    read-only: a store may share one object between the messages stored with
    the same properties. They hold no copy of the body, so that keeping them
    does not keep the body alive twice.
    """

    exchange: str
    routing_key: str
    properties: Any
    body: bytes
    published_at: Any = None  # ms on the broker's clock, or None


class SerializedPropertiesMessage:
    """
    A message to C{append} whose properties come serialised (an encoded
    C{BasicProperties}, C{serialized_properties}), as a replication stream
    carries them: a store that encodes messages puts those bytes into its
    record as they are, instead of serialising a properties object again.
    C{properties} parses them, once, only for a store (or a reader) that asks.
    """

    __slots__ = ("exchange", "routing_key", "serialized_properties", "body", "published_at",
                 "_properties")

    def __init__(self, exchange, routing_key, serialized_properties, body, published_at=None):
        self.exchange = exchange
        self.routing_key = routing_key
        self.serialized_properties = serialized_properties
        self.body = body
        self.published_at = published_at
        self._properties = None

    @property
    def properties(self):
        if self._properties is None:
            self._properties = messages_pb2.BasicProperties.FromString(self.serialized_properties)
        return self._properties


class DelayedMessage(NamedTuple):
    """
    One delayed message kept by an L{IDelayedMessageStore}, as
    C{delayed_after} hands it back.

    @ivar due: when it is due, in int milliseconds since the epoch.
    @ivar handle: the int C{delay} returned for it.
    @ivar exchange: the delayed exchange it was published to, a C{(vhost, name)} key.
    @ivar record: the message, a L{MessageRecord}.
    """

    due: int
    handle: int
    exchange: tuple
    record: Any


class IDelayedMessageStore(Interface):
    """
    Messages published to delayed exchanges, kept ordered by due time until they are routed.

    A scheduler on the model side (L{brokerd.model.delayeddelivery}, whose
    docstring maps the feature's modules per backend) asks for windows of
    due messages, routes them and releases them. A durable store keeps them on
    disk and hands them back a window at a time, ordered by C{(due, handle)}:
    chunked and sqlite keep that order on disk too and need not hold every
    delayed message in memory; filelog keeps its index in memory, rebuilt from
    its log at open.
    """

    def delay(message, exchange, due):
        """
        Keep C{message} (any object with a L{MessageRecord}'s attributes, as
        C{append} takes) for the delayed exchange C{exchange}, a C{(vhost,
        name)} key, until C{due} (int milliseconds since the epoch, 0 <= due
        < 2**63). Buffered like C{append}: durable once a later C{sync()}
        fires.

        @return: a handle: an int, strictly increasing with each call over the
            store's whole life (also across restarts).
        @raise ValueError: if C{due} is not such an int.
        """

    def delayed_after(cursor, until, limit):
        """
        The kept (not released) delayed messages whose key C{(due, handle)} is
        greater than C{cursor} (a C{(due, handle)} tuple, or None for from the
        start) and whose C{due <= until}, ordered by C{(due, handle)}, at most
        C{limit} of them. It sees delays made before the call, committed or not.

        @return: a Deferred firing with a list of L{DelayedMessage}; it fails
            with L{StoreCorrupted} if the part of the index the window needs is
            damaged.
        """

    def release(handle):
        """
        The delayed message was routed (or dropped): forget it. Buffered like
        C{ack}; unknown handles (and handles already released) are ignored.
        """


class StoreCorrupted(Exception):
    """
    A store found damage it cannot repair on its own (a bad record in the middle
    of a file, say). Raised by C{recover(queue)} for the queue concerned: the
    broker then marks that queue unavailable and goes on with the others.

    @ivar path: the damaged file.
    @ivar offset: where in it the damage starts, if known.
    """

    def __init__(self, text, path=None, offset=None):
        super().__init__(text)
        self.path = path
        self.offset = offset


class StoreInUse(Exception):
    """
    A store's files are held by another open store, most likely a broker
    running on the same data directory: C{open} fails with this (or a
    subclass) rather than let two writers corrupt them.
    """


class UnreadableMessage(StoreCorrupted):
    """
    A stored message whose record is intact (its checksum holds) but cannot
    be read back, e.g. a field table nested deeper than protobuf parses.
    Raised by C{IPagingStore.load}: the store has kept a copy of the record
    aside, and the queue quarantines that one message (never delivers it,
    forgets it) and goes on with the next. As a L{StoreCorrupted}, code that
    knows nothing of quarantine still treats it as damage.
    """


class QuarantinedRecord(NamedTuple):
    """
    A topology record a store holds but cannot read back, handed out by
    C{IMessageStore.topology} in its place. The store keeps the record (and a
    queue's messages) on disk as they are; the broker names it in the log and,
    for a queue whose name is known, keeps the name taken by an unavailable
    queue, so that nothing new mixes with the data kept for it.

    @ivar kind: C{"exchange"}, C{"queue"} or C{"binding"}.
    @ivar vhost: its virtual host, or None if even that cannot be read.
    @ivar name: the exchange's or queue's name, a binding's C{(exchange,
        queue, routing key)} (or, for a binding to an exchange, C{(exchange,
        "", routing key, destination exchange)}), or None if it cannot be read.
    @ivar where: where the store keeps it (a file and offset, a table row).
    @ivar reason: why it cannot be read.
    """

    kind: str
    vhost: Any
    name: Any
    where: str
    reason: str


class IStoreBackend(Interface):
    """
    A storage backend that C{--backend=NAME[:key=value...]} can pick.

    Backends are registered under the C{brokerd.backends} entry-point group.

    A backend may also have C{replica_options}: options (a dict like the backend string's,
    values as strings) for a store that only a replication stream writes and nothing reads
    (a cluster follower's), given over the user's; for example no cache of recent messages
    for reads, which there would only cost memory and time.
    """

    name = Attribute("The name users pass to C{--backend}.")
    description = Attribute("One line saying what the backend is for.")
    options = Attribute(
        "A dict of option name to C{(default, help)} for the C{key=value} parts"
        " of the backend string; defaults are strings, as typed by users."
    )

    def make_store(data_dir, sync_policy, *, reactor, **options):
        """
        Build (without opening) a store.

        @param data_dir: the directory the broker keeps its data in
            (C{--data-dir}); a backend keeps its files under it unless an
            option says otherwise.
        @param sync_policy: a L{brokerd.storage.durability.SyncPolicy} (C{--sync}):
            when C{sync()} may fire. Durable backends commit through a
            L{brokerd.storage.durability.GroupCommit} built with it.
        @param reactor: the reactor whose clock and threads a durable
            store's commits run on; no store falls back to the global one.
        @param options: the backend string's C{key=value} options, as strings,
            already checked against C{options}.
        @return: an L{IMessageStore} provider.
        @raise ValueError: if an option's value is not acceptable; the message
            names the option.
        """


class ITimedCommits(Interface):
    """
    A store whose commits go through a L{brokerd.storage.durability.GroupCommit}
    (every durable backend's): how long they took, for the metrics, and when each
    starts, so that a replication stream sends what a commit will cover as it starts.
    """

    def commit_times():
        """The store's L{brokerd.storage.durability.CommitTimes}, or None before it has opened."""

    def watch_commit_starts(listener):
        """
        Call C{listener()} on the reactor thread as each commit takes what is buffered
        (and on each idle tick of the store's commit timer), before it is written.
        """


class ICommitFailures(Interface):
    """
    A store whose commits can fail while it runs (a full disk): it says which
    appends a failed commit lost, so that the broker never delivers a message
    whose publish it nacked. The store acts as if it never held them: an
    C{ack} of one afterwards is harmless, and a restart does not bring back one
    that a later commit acked.
    """

    def watch_commit_failures(listener):
        """
        Call C{listener(failure, lost)} on the reactor thread after each failed
        commit, before the syncs it covers fail: C{failure} is why, C{lost} a
        list of the C{(queue key, handle)} of the appends it held.
        """

    def commit_ledger():
        """
        The L{brokerd.storage.durability.CommitLedger} of the store's commits: a
        writer that notes its C{started} when it writes learns from its
        C{lost(started)} whether those writes were lost, even when they were
        taken by a commit that ended before the writer's C{sync()}.
        """


class IVhostStores(Interface):
    """
    The stores of the vhosts that have one of their own (created with a
    backend string): where their files live, building, opening and removing
    them (L{brokerd.storage.vhost_stores.VhostStores}).
    """

    def make(vhost, backend):
        """
        The unopened L{IMessageStore} the backend string C{backend} describes
        for C{vhost}; raises ValueError.
        """

    def open(vhost, backend):
        """
        A Deferred firing with C{vhost}'s store opened, or failing with an
        error naming the vhost and the fault.
        """

    def remove_files(vhost):
        """Delete the files of C{vhost}'s own store (closed already): the vhost is deleted."""
