"""A consistent snapshot of a leader's tapped stores, produced lazily for one follower.

Taken in one reactor turn at stream position C{S0} (the taps' topology and
maps of every held message and delayed message, copied), then sent as
ordinary operations a few at a time, reading each body from the store only
when the follower's transport takes more. A message acked, purged or released
since C{S0} is skipped when its turn comes (its ack, which follows the
snapshot in the stream, then finds nothing); operations after C{S0} are
pinned in the stream until the snapshot ends, and sent after it.
"""

from twisted.internet import defer

from brokerd.proto import replication_pb2
from brokerd.replication import codec
from brokerd.replication.operations import queue_key
from brokerd.replication.replica import DELAYED_WINDOW, FOREVER


class Snapshot:
    """
    The frames of one snapshot. L{next} gives the next frame's parts, a
    Deferred to wait for (a body or a window of delayed messages being read),
    or None at the end (after the snapshot-end frame).

    @ivar position: C{S0}, the stream position the snapshot stands for.
    @ivar messages: how many messages were sent; C{skipped}: how many were
        gone by their turn.
    """

    def __init__(self, stream, access_document=None):
        self._stream = stream
        self.position = stream.cut()
        self._pin = stream.pin(self.position + 1)
        views = [(tap, tap.snapshot_view()) for tap in stream.taps.values()]
        document = access_document() if access_document is not None else None
        self.messages = self.skipped = 0
        self._frames = self._produce(views, document)
        self._sent = None  # what the last Deferred gave, to send into the generator
        self._thrown = None  # or how it failed, to raise there

    def next(self):
        try:
            sent, self._sent = self._sent, None
            thrown, self._thrown = self._thrown, None
            found = self._frames.throw(thrown) if thrown else self._frames.send(sent)
        except StopIteration:
            return None
        if isinstance(found, defer.Deferred):
            return found.addCallbacks(self._received, self._failed)
        return found

    def _received(self, result):
        self._sent = result

    def _failed(self, failure):
        self._thrown = failure.value

    def close(self):
        """Stop (done or abandoned): the stream may drop the operations it kept for this."""
        self._stream.unpin(self._pin)
        self._frames.close()

    def _frame(self, operation, record, body=b"", replication_id=0):
        return codec.operation_parts(replication_id, operation, record.SerializeToString(), body,
                                     kind=codec.SNAPSHOT)

    def _produce(self, views, document):
        if document is not None:
            yield self._frame(codec.ACCESS_DOCUMENT, replication_pb2.ReplicatedOperation(),
                              document)
        for tap, view in views:
            yield from self._topology(tap.store_name, view)
        for tap, view in views:
            for queue, live, entries, counts in view.messages:
                yield from self._queue(tap, queue, live, entries, counts)
            if view.delayed:
                yield from self._delayed(tap, view.delayed)
        yield codec.frame(codec.SNAPSHOT_END, codec.SEQUENCE.pack(self.position)),

    def _topology(self, name, view):
        operation = replication_pb2.ReplicatedOperation
        for record in view.exchanges:
            yield self._frame(codec.SAVE_EXCHANGE, operation(store=name, exchange=record))
        for record in view.queues:
            yield self._frame(codec.SAVE_QUEUE, operation(store=name, queue_record=record))
        for record in view.bindings:
            yield self._frame(codec.SAVE_BINDING, operation(store=name, binding=record))

    def _queue(self, tap, queue, live, entries, counts):
        store, loads = tap.store, hasattr(tap.store, "load")
        for handle, replication_id in entries.items():
            if not tap.holds(queue, live, handle, replication_id):
                self.skipped += 1
                continue
            try:
                message = store.load(handle) if loads else (yield store.read(handle))
            except KeyError:
                self.skipped += 1
                continue
            if not tap.holds(queue, live, handle, replication_id):  # acked while read
                self.skipped += 1
                continue
            operation = tap.operations.message(message, queues=[queue_key(queue)])
            self.messages += 1
            yield self._frame(codec.APPEND, operation, message.body, replication_id)
            count = counts.get(handle)
            if count:
                yield self._frame(codec.RETURNED, replication_pb2.ReplicatedOperation(
                    store=tap.store_name, queues=[queue_key(queue)], messages=[replication_id],
                    count=count))

    def _delayed(self, tap, delayed):
        cursor = None
        while True:
            window = yield tap.store.delayed_after(cursor, FOREVER, DELAYED_WINDOW)
            for item in window:
                replication_id = delayed.get(item.handle)
                if replication_id is None or not tap.holds_delayed(item.handle, replication_id):
                    continue
                operation = tap.operations.message(item.record, target=queue_key(item.exchange),
                                                  due=item.due)
                yield self._frame(codec.DELAY, operation, item.record.body, replication_id)
            if len(window) < DELAYED_WINDOW:
                return
            cursor = (window[-1].due, window[-1].handle)
