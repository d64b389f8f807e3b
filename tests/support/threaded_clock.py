"""A task.Clock for code that also hands results back from a thread (a store's writer): the test
drives the timers, and what the thread sends back still reaches the real reactor."""

from twisted.internet import reactor, task


class ThreadedClock(task.Clock):
    """Time from a task.Clock (driven by the test), results from the writer thread through the real reactor."""

    def callFromThread(self, function, *args, **kwargs):
        reactor.callFromThread(function, *args, **kwargs)
