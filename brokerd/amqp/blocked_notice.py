"""What an AMQP client is told of why the broker holds its publishes back.

A connection may be held back for more than one reason at a time: the broker's
memory and disk alarms and a cluster leader's in-sync alarm (every publisher)
and its own share of memory (L{brokerd.wire.connection_memory}). A client that
understands connection.blocked is told once when the first reason comes, with
that reason, and
connection.unblocked once when the last one goes, so that lifting one does not
tell it that it may publish while another still holds it back.
"""

from pamqp import commands

from brokerd.amqp import frames
from brokerd.wire.backpressure import REPLICATION

MEMORY_ALARM = "low on memory"  # RabbitMQ's reason for its memory alarm
OVER_SHARE = "connection over its memory share"


def alarm_reason(resources, in_sync_alarm=None):
    """
    RabbitMQ's reason for the resource alarms that hold a publisher
    (L{brokerd.wire.backpressure.MEMORY}, L{DISK<brokerd.wire.backpressure.DISK>}):
    "low on memory", "low on disk", "low on memory & disk"; for a cluster
    leader's in-sync alarm (L{REPLICATION}), the reason of C{in_sync_alarm}
    (L{brokerd.model.in_sync_alarm.InSyncAlarm}), after those if both hold it.
    """
    low = [resource for resource in resources if resource != REPLICATION]
    reasons = ["low on " + " & ".join(low)] if low else []
    if REPLICATION in resources:
        reasons.append(in_sync_alarm.reason)
    return "; ".join(reasons)


class BlockedNotice:
    """The reasons one connection is blocked for, and the notices they give its client."""

    __slots__ = ("_writes", "_reasons")

    def __init__(self, writes):
        """@param writes: the connection's L{brokerd.wire.write_buffer.WriteBuffer}."""
        self._writes = writes
        self._reasons = []

    def change(self, reason, blocked):
        """C{reason} holds the connection back (C{blocked}) or no longer does."""
        reasons = self._reasons
        if blocked:
            if reason in reasons:
                return
            reasons.append(reason)
            if len(reasons) > 1:
                return
            method = commands.Connection.Blocked(reason=reason)
        else:
            if reason not in reasons:
                return
            reasons.remove(reason)
            if reasons:
                return
            method = commands.Connection.Unblocked()
        self._writes.send(frames.method_frame(0, method))
        self._writes.flush()
