"""Delayed delivery: messages published to an x-delayed-message exchange with an x-delay header.

Such a message is handed to the store (L{IDelayedMessageStore}), which keeps
it ordered by due time, durably in the durable backends, and it is routed
through its exchange (as the exchange's x-delayed-type) once due. Millions of
delayed messages never live in memory at once: the L{DelayScheduler} holds
only a window of the soonest ones, loaded from the store's due-time index a
window at a time, plus the ones published since whose time falls inside the
window. A tick of the broker's clock fires what is due, so a message goes out
within a tick (10 ms) of its time under normal load; after a restart, what
fell due while the broker was down goes out at the first tick.

Where the feature lives, layer by layer:

  - this module is the model's side: L{delay_of} reads the x-delay header
    (for L{brokerd.model.exchange}, L{brokerd.model.vhost} and
    L{brokerd.model.deadletter}, which decide whether to hold a message),
    L{fired} marks a due message's copy, and the L{DelayScheduler} (one per
    store: the broker's, and each vhost's own) moves messages into that store
    and out of it when due;
  - L{brokerd.interfaces.IDelayedMessageStore} and
    L{brokerd.interfaces.DelayedMessage} are what every store promises;
  - L{backends.common} holds what the stores share:
    L{backends.common.delayed_requests} (argument checks, the
    L{HandleLease} that keeps handles increasing across restarts, and the
    window that merges the writer thread's rows with the delays not yet
    handed to it), L{backends.common.delayed_meta} (the small meta file
    of the file-based stores) and L{backends.common.sorted_runs} (the
    sorted runs and L{MemoryBucket}s in which the file-based stores hold
    due-time entries as arrays);
  - memory: L{backends.memory.store} keeps them in memory, in due order by
    a L{backends.memory.sortedkeys.SortedKeys};
  - sqlite: L{backends.sqlite.delayed}, a table indexed by C{(due, handle)}
    that the writer thread keeps with L{DelayedTable};
  - filelog: L{backends.filelog.delayedlog}, an append-only delayed log
    (L{FilelogDelayedLog}) whose due-time order
    (L{FilelogDelayedMemoryIndex}) is only in memory, rebuilt from the log
    at open;
  - chunked: the records go to the message log like any message's, and
    L{backends.chunked.delayedindex} is the on-disk due-time index
    (L{ChunkedDelayedIndex}: a journal plus one file per bucket of due
    time), L{backends.chunked.delayedbuckets} one bucket's file and
    memtable (L{ChunkedDelayedBucket}), L{backends.chunked.delayedformat}
    the bytes of those files.

In each backend, C{store.py} provides L{IDelayedMessageStore} on the reactor
thread; the backend's own modules named above work on its writer thread.
"""

import heapq
import re

from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from brokerd.model.message import Message
from brokerd.proto import messages_pb2
from brokerd.proto.tables import value_to_python

log = Logger()

TICK_SECONDS = 0.01
WINDOW_MESSAGES = 1000  # delayed messages loaded from the store at a time
WINDOW_MILLISECONDS = 60_000  # how far ahead one load looks
# The next window is loaded this long before the current one runs out:
LOAD_AHEAD_MILLISECONDS = 1_000
LAST_HANDLE = 2**63
# A string x-delay the plugin reads as a number (longer: too long):
_WHOLE_NUMBER = re.compile(r"[+-]?[0-9]{1,18}")
# Milliseconds (49.7 days), as RabbitMQ's delayed-message exchange; longer ones are not held:
LONGEST_DELAY = 2**32 - 1


def delay_of(message):
    """
    The x-delay header in milliseconds, or None if the message is not to be
    held. As the delayed-message plugin reads it: an integer, a float (its
    whole part) or a string of decimal digits; a delay from 1 to
    L{LONGEST_DELAY} holds the message, any other routes it at once.
    """
    if not message.properties.HasField("headers"):
        return None
    return _held_for(message.headers.get("x-delay"))


def _held_for(value):
    if isinstance(value, float):
        value = int(value) if abs(value) < 2**63 else None  # neither NaN nor an infinity
    elif isinstance(value, str):
        value = int(value) if _WHOLE_NUMBER.fullmatch(value) else None
    elif isinstance(value, bool) or not isinstance(value, int):
        return None
    if value is None or not 0 < value <= LONGEST_DELAY:
        return None
    return value


def fired(message):
    """
    A copy of a delayed C{message} to route once due, its x-delay header made
    negative (a signedint) as the delayed-message plugin does: no delayed
    exchange it reaches holds it again, and a consumer can tell it was delayed.
    Only that header is rewritten; the others are not decoded.
    """
    properties = messages_pb2.BasicProperties()
    properties.CopyFrom(message.properties)
    # The last of a repeated name is the one that counts.
    for field in reversed(properties.headers.fields):
        if field.name == "x-delay":
            delay = _held_for(value_to_python(field.value))
            if delay is None:
                return message
            field.value.Clear()
            field.value.integer_value = -delay
            field.value.integer_kind = messages_pb2.INT32 if delay <= 2**31 else messages_pb2.INT64
            return Message(message.exchange, message.routing_key, properties, message.body)
    return message


class DelayScheduler:
    """
    Keeps the delayed messages of one store moving: into the store when
    published, out of it in due-time windows, into their exchanges when due.
    """

    def __init__(self, broker, store=None):
        """
        Keeps the delayed messages of C{store} (the broker's own by default: a
        vhost with its own has its own).
        """
        self._broker = broker
        self._store = broker.store if store is None else store
        self._clock = broker.clock
        self._soonest = []  # heap of (due, handle, vhost name, exchange name, message or record)
        self._in_soonest = set()  # the handles in it
        self._cursor = None  # (due, handle): every stored delay up to it is in _soonest or gone
        # Delays due before this go straight into _soonest (covered by a load done or running):
        self._bound = None
        self._loading = None  # the Deferred of a window being loaded
        self._tick = None
        self.fired = 0

    def now(self):
        return int(self._clock.seconds() * 1000)

    def start(self):
        """Begin: load the first window (overdue ones first) and tick."""
        if self._tick is not None:
            return
        self._tick = LoopingCall(self.fire_due)
        self._tick.clock = self._clock
        self._tick.start(TICK_SECONDS, now=False)
        self._load()

    def stop(self):
        if self._tick is not None and self._tick.running:
            self._tick.stop()
        self._tick = None

    def delay(self, vhost, exchange, message, milliseconds):
        """Keep C{message}, published to the delayed C{exchange}, until C{milliseconds} from now."""
        if self._tick is None:
            self.start()
        due = self.now() + milliseconds
        handle = self._store.delay(message, (vhost.name, exchange.name), due)
        if self._bound is not None and due < self._bound:
            self._push(due, handle, vhost.name, exchange.name, message)
        return handle

    def _push(self, due, handle, vhost_name, exchange_name, message):
        if handle not in self._in_soonest:
            self._in_soonest.add(handle)
            heapq.heappush(self._soonest, (due, handle, vhost_name, exchange_name, message))

    def fire_due(self):
        """Route every delayed message whose time has come; load the next window when it is near."""
        now = self.now()
        soonest = self._soonest
        while soonest and soonest[0][0] <= now:
            _, handle, vhost_name, exchange_name, message = heapq.heappop(soonest)
            self._in_soonest.discard(handle)
            self._route(handle, vhost_name, exchange_name, message)
        if (
            self._cursor is not None
            and self._loading is None
            and now + LOAD_AHEAD_MILLISECONDS >= self._cursor[0]
        ):
            self._load()

    def _route(self, handle, vhost_name, exchange_name, message):
        self._store.release(handle)
        self.fired += 1
        vhost = self._broker.vhosts.get(vhost_name)
        exchange = vhost.exchanges.get(exchange_name) if vhost is not None else None
        if exchange is None:
            log.warn(
                "delayed message for exchange {exchange!r} in vhost {vhost!r} dropped:"
                " the exchange is gone",
                exchange=exchange_name, vhost=vhost_name,
            )
            return
        # A record the store gave back, not the message as published:
        if type(message) is not Message:
            message = Message.from_record(message)
        message = fired(message)
        try:
            vhost.route_now(exchange, message)
        except Exception:
            log.failure(
                "a delayed message for exchange {exchange!r} in vhost {vhost!r}"
                " could not be routed",
                exchange=exchange_name, vhost=vhost_name,
            )

    def _load(self):
        until = self.now() + WINDOW_MILLISECONDS
        self._bound = max(self._bound or 0, until)
        loading = self._loading = self._store.delayed_after(self._cursor, until, WINDOW_MESSAGES)
        loading.addCallback(self._loaded, until)  # may run at once (and clear _loading)
        loading.addErrback(self._load_failed)

    def _loaded(self, window, until):
        self._loading = None
        for delayed in window:
            vhost_name, exchange_name = delayed.exchange
            self._push(delayed.due, delayed.handle, vhost_name, exchange_name, delayed.record)
        if len(window) < WINDOW_MESSAGES:
            self._cursor = (until, LAST_HANDLE)
        else:
            self._cursor = (window[-1].due, window[-1].handle)

    def _load_failed(self, failure):
        self._loading = None
        log.failure(
            "delayed messages could not be loaded from the store; trying again at the next tick",
            failure,
        )
