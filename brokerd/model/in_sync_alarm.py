"""Back-pressure on publishers while a cluster's leader has too few nodes in sync.

A leader confirms a persistent message only once C{--cluster-min-isr} nodes of its in-sync
set (itself included) hold it; with fewer in sync, its confirms wait. Publishers that do not
wait for confirms would meanwhile fill the leader's memory with messages no follower holds.
So, while the set is smaller than the minimum, publishing connections are held as the memory
watermark and the disk alarm hold them (AMQP clients get connection.blocked, naming the
cause), while consumers and acks go on; once enough nodes are in sync again, they resume.

RabbitMQ has no such alarm (its quorum queues hold confirms and let publishers fill their
credit instead). The alarm only keeps state: the leader's in-sync set tells it each size it
takes (L{brokerd.process.cluster_leader}). A broker on its own, or a follower, never raises it.
"""

from twisted.logger import Logger

from brokerd.model.alarm_waiters import AlarmWaiters

log = Logger()


class InSyncAlarm:
    """
    The in-sync alarm of a cluster's leader: raised while fewer nodes are in sync than the
    minimum.

    @ivar in_sync: the nodes of the in-sync set last told (the leader included), or None
        before the first (a broker that leads no cluster).
    @ivar min_in_sync: the fewest nodes in sync that let publishers on.
    @ivar blocked: True while the alarm is raised.
    """

    def __init__(self):
        self.in_sync = None
        self.min_in_sync = 1
        self.blocked = False
        self._waiting = AlarmWaiters()  # publishers held until it clears

    @property
    def reason(self):
        """What an AMQP client is told when the alarm holds it back."""
        nodes = "node" if self.in_sync == 1 else "nodes"
        return (f"replication: {self.in_sync} in-sync {nodes} of the {self.min_in_sync}"
                " --cluster-min-isr asks for")

    def measured(self, in_sync, min_in_sync):
        """
        The in-sync set holds C{in_sync} nodes now (the leader included), and C{min_in_sync}
        are asked for: raise the alarm below that, clear it at or above.
        """
        self.in_sync = in_sync
        self.min_in_sync = min_in_sync
        if in_sync < min_in_sync and not self.blocked:
            self.blocked = True
            log.warn("{reason}: blocking publishers", reason=self.reason)
        elif in_sync >= min_in_sync and self.blocked:
            self.blocked = False
            log.info("replication: {count} nodes in sync, as --cluster-min-isr asks:"
                     " unblocking publishers", count=in_sync)
            self._waiting.release()

    def when_unblocked(self, resume):
        """Call C{resume()} once the alarm clears (at once if it is not raised)."""
        self._waiting.when_clear(self.blocked, resume)

    def forget(self, resume):
        """A connection closed: do not call its C{resume}."""
        self._waiting.forget(resume)
