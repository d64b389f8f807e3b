"""
A clock for deadlines that must hold whatever the wall clock does: the reactor's own
C{seconds()} is wall time, which an administrator or NTP may step, so a fencing deadline
counted on it could pass late. L{SteadyClock} counts on the kernel's boot-time clock (it goes on
while the machine sleeps, unlike the monotonic one) and leaves timers to the reactor.
"""

import time

from twisted.internet.interfaces import IReactorTime
from zope.interface import implementer

_CLOCK_ID = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


@implementer(IReactorTime)
class SteadyClock:
    """C{IReactorTime} whose C{seconds()} never steps back or jumps; C{callLater} is the
    reactor's (its delays are relative)."""

    def __init__(self, reactor):
        self._reactor = reactor

    def seconds(self):
        return time.clock_gettime(_CLOCK_ID)

    def callLater(self, delay, callable, *args, **kw):
        return self._reactor.callLater(delay, callable, *args, **kw)

    def getDelayedCalls(self):
        return self._reactor.getDelayedCalls()
