"""Deliveries held back while a connection's burst of frames is read.

A publisher that pipelines sends many messages in one read. Were each handed
to a waiting consumer as it is enqueued, every message would go down the
delivery path alone; held until the burst has been read (the same reactor
turn, before anything is written), a queue's new messages go to its consumer
as one run (L{brokerd.model.queue.Queue.dispatch}). Clients see the same
frames: the writes of a turn leave together at its end either way.
"""


class HeldDispatches:
    """
    The queues of one vhost that got messages for their consumers while
    dispatching was held, in the order they got them.

    @ivar holding: True while dispatching is held: a queue that gets a
        message then is remembered (L{dispatch}), not dispatched at once.
    """

    __slots__ = ("holding", "_depth", "_queues")

    def __init__(self):
        self.holding = False
        self._depth = 0
        self._queues = {}  # queue -> None, in the order of their first message held back

    def hold(self):
        """Hold dispatching until the matching L{release}."""
        self._depth += 1
        self.holding = True

    def dispatch(self, queue):
        """C{queue} got a message for its consumers: it dispatches now, or at the release."""
        if self.holding:
            self._queues[queue] = None
        else:
            queue.dispatch()

    def release(self):
        """End a L{hold}; the last one dispatches every queue remembered meanwhile."""
        self._depth -= 1
        if self._depth:
            return
        self.holding = False
        while self._queues:
            queues, self._queues = self._queues, {}
            for queue in queues:
                if not queue.deleted:
                    queue.dispatch()
