"""The steady clock that fencing deadlines are counted on."""

import time

from twisted.internet import defer, reactor
from twisted.internet.interfaces import IReactorTime
from twisted.trial import unittest
from zope.interface.verify import verifyObject

from brokerd.cluster.clock import SteadyClock


class SteadyClockTests(unittest.TestCase):
    def test_it_is_a_reactor_clock_counting_boot_time_not_wall_time(self):
        clock = SteadyClock(reactor)
        self.assertTrue(verifyObject(IReactorTime, clock))
        boot = time.clock_gettime(getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC))
        self.assertLess(abs(clock.seconds() - boot), 1.0)
        self.assertGreater(abs(clock.seconds() - time.time()), 1000)  # not the wall clock

    def test_its_timers_are_the_reactors(self):
        clock = SteadyClock(reactor)
        fired = defer.Deferred()
        call = clock.callLater(0.01, fired.callback, "fired")
        self.assertIn(call, clock.getDelayedCalls())
        return fired.addCallback(self.assertEqual, "fired")
