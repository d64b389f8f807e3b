"""Back-pressure on the transport: why the broker is not reading a client's
socket, the gate that stops reading from a publisher while the broker is
blocked (by the L{brokerd.model.watermark.MemoryWatermark}, the
L{brokerd.model.disk_alarm.DiskAlarm} or a cluster leader's
L{brokerd.model.in_sync_alarm.InSyncAlarm}), and the bytes a connection holds
against that watermark.

Reading from one client can stop for more than one reason at a time (the
broker is blocked; the client does not read what we write to it):
L{ReadingPauses} keeps the reasons, so that lifting one does not lift another.
"""

import weakref
from functools import partial

# A connection part-way through a frame at least this large holds memory as a
# publisher does and is blocked like one; a smaller frame split across two reads
# (a consumer's ack) never blocks its connection, whose acks may be what frees memory.
LARGE_PARTIAL_FRAME = 64 * 1024

# Why reading from a client is paused (see ReadingPauses).
BROKER_BLOCKED = "broker blocked"  # a resource alarm is raised and this connection publishes
SLOW_READER = "slow reader"  # the transport's write buffer is full: the client is not reading

# The resources whose alarms block publishers, as RabbitMQ's connection.blocked names them.
MEMORY = "memory"
DISK = "disk"
# brokerd's own: a cluster's leader with fewer nodes in sync than --cluster-min-isr.
REPLICATION = "replication"


class ReadingPauses:
    """
    Why the broker is not reading one client's transport: a set of reasons.

    The transport stops reading with the first reason and starts again when
    the last one is lifted; C{on_resume} is then called (a protocol parses the
    bytes it had read but held back meanwhile). Use L{reading_pauses} to get
    the one instance of a transport, shared by everything that pauses it.
    """

    __slots__ = ("_transport", "reasons", "_held", "on_resume", "hangup_watch", "__weakref__")

    def __init__(self, transport):
        # The registry's key: a strong reference would keep it alive.
        self._transport = weakref.ref(transport)
        self.reasons = set()
        self._held = False  # the socket is not read while what was read waits for the next turn
        self.on_resume = None
        # Started while reading is paused, so that a client that goes away then is still noticed
        # (a protocol sets one: brokerd.wire.hangup_watch.HangupWatch).
        self.hangup_watch = None

    def pause(self, reason):
        if not self.reasons:
            transport = self._transport()
            if transport is not None and not self._held:
                transport.pauseProducing()
            if self.hangup_watch is not None:
                self.hangup_watch.start()
        self.reasons.add(reason)

    def resume(self, reason):
        if reason not in self.reasons:
            return
        self.reasons.discard(reason)
        if self.reasons:
            return
        if self.hangup_watch is not None:
            self.hangup_watch.stop()
        transport = self._transport()
        if transport is not None and not self._held:
            transport.resumeProducing()
        if self.on_resume is not None:
            self.on_resume()

    def hold_reading(self):
        """
        Stop reading the socket, without a reason that stops parsing: the
        connection has whole frames left to parse on later turns
        (L{brokerd.wire.fairness.TurnTaking}), and reading more meanwhile would only
        pile them up.
        """
        if not self._held:
            self._held = True
            transport = self._transport()
            if transport is not None and not self.reasons:
                transport.pauseProducing()

    def release_reading(self):
        """What was held is parsed: read the socket again, unless a reason still pauses it."""
        if self._held:
            self._held = False
            transport = self._transport()
            if transport is not None and not self.reasons:
                transport.resumeProducing()

    def close(self):
        """The connection is gone: stop watching it and let go of its protocol (whose callbacks
        would otherwise keep the transport, the registry's key, and all it holds alive)."""
        if self.hangup_watch is not None:
            self.hangup_watch.stop()
        self.hangup_watch = self.on_resume = None
        transport = self._transport()
        if transport is not None:
            _pauses_by_transport.pop(transport, None)


_pauses_by_transport = weakref.WeakKeyDictionary()


def reading_pauses(transport):
    """The L{ReadingPauses} of C{transport}, made on first use."""
    pauses = _pauses_by_transport.get(transport)
    if pauses is None:
        pauses = _pauses_by_transport[transport] = ReadingPauses(transport)
    return pauses


class PublisherGate:
    """
    Pauses reading from one publishing connection while the broker is blocked:
    by the memory watermark, or by the disk alarm (L{brokerd.model.disk_alarm}),
    or both, as RabbitMQ's resource alarms do, or by a cluster leader's in-sync
    alarm (L{brokerd.model.in_sync_alarm}).

    C{notify(blocked_by)} is called on each change so a protocol can tell its
    client (AMQP's connection.blocked / unblocked): with the resources that
    block it (L{MEMORY}, L{DISK}, L{REPLICATION}) when it starts being held,
    with an empty list once none does. The pause is one reason among others (L{ReadingPauses}):
    unblocking does not resume reading from a client that is paused for
    another reason.

    @ivar blocked_by: the resources holding this connection now, in the order
        they came.
    """

    def __init__(self, watermark, transport, notify=None, disk_alarm=None, in_sync_alarm=None):
        alarms = ((MEMORY, watermark), (DISK, disk_alarm), (REPLICATION, in_sync_alarm))
        self._alarms = tuple((resource, alarm) for resource, alarm in alarms if alarm is not None)
        self._reading = reading_pauses(transport)
        self._notify = notify
        self.blocked_by = []
        self._resumes = {}  # resource -> the callable its alarm calls when it clears

    @property
    def paused(self):
        return bool(self.blocked_by)

    def check(self):
        """
        After a publish, or bytes of one: stop reading from this connection if
        the broker is blocked.
        """
        held = self._hold_for_raised_alarms()
        if held and len(held) == len(self.blocked_by):  # it was not held before
            self._reading.pause(BROKER_BLOCKED)
            if self._notify is not None:
                self._notify(list(self.blocked_by))

    def _hold_for_raised_alarms(self):
        """Wait for each raised alarm not waited for yet; returns their resources."""
        held = []
        for resource, alarm in self._alarms:
            if alarm.blocked and resource not in self._resumes:
                self._resumes[resource] = resume = partial(self._resume, resource)
                self.blocked_by.append(resource)
                held.append((alarm, resume))
        for alarm, resume in held:
            alarm.when_unblocked(resume)
        return held

    def _resume(self, resource):
        if self._resumes.pop(resource, None) is None:
            return
        self.blocked_by.remove(resource)
        # Another alarm raised meanwhile holds it on, unannounced, as RabbitMQ does.
        if self._resumes or self._hold_for_raised_alarms():
            return
        if self._notify is not None:
            self._notify([])
        self._reading.resume(BROKER_BLOCKED)

    def close(self):
        for resource, alarm in self._alarms:
            resume = self._resumes.pop(resource, None)
            if resume is not None:
                alarm.forget(resume)
        self.blocked_by = []


class HeldBytes:
    """
    Bytes one connection holds for the watermark (replies its client has not
    read yet, bodies being assembled): added as they are taken, released as
    they go, and all at once when the connection goes.
    """

    __slots__ = ("_watermark", "size")

    def __init__(self, watermark):
        self._watermark = watermark
        self.size = 0

    def add(self, size):
        self.size += size
        self._watermark.add(size)

    def release(self, size=None):
        """Release C{size} of the bytes held, or all of them."""
        if size is None:
            size = self.size
        self.size -= size
        if size:
            self._watermark.release(size)


class ConnectionFlow:
    """
    How bytes flow through one connection besides its frames: why we are not
    reading from it (L{ReadingPauses}), what it holds against the memory
    watermark (replies waiting for a client that does not read; bodies being
    assembled) and when it last sent anything. One slotted object keeps a
    protocol's own attributes few: past 30 of them, CPython's attribute lookups,
    which every frame makes, get slower.
    """

    __slots__ = ("pauses", "unsent", "body_bytes", "received_at", "refusing")

    def __init__(self, watermark, inbound=None):
        """
        @param inbound: what the bodies being assembled count against: the
            connection's L{brokerd.wire.connection_memory.ConnectionMemory}
            (None: C{watermark} alone).
        """
        self.pauses = None  # the transport's ReadingPauses, once connected
        # Written while the transport had paused us, until it drains:
        self.unsent = HeldBytes(watermark)
        # In the channels' unfinished contents:
        self.body_bytes = HeldBytes(watermark if inbound is None else inbound)
        self.received_at = 0.0
        self.refusing = False  # a refusal before login is on its way: nothing more is read
