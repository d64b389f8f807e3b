"""Stop signals for a program that runs a reactor (the broker, the native command
line): the first SIGTERM or SIGINT stops it, as Twisted's own handlers do, and
later ones are logged and ignored instead of failing loudly."""

import signal
import threading

from twisted.logger import Logger

log = Logger()


def stop_once_on_signals(reactor):
    """
    Make the first SIGTERM or SIGINT stop the reactor as Twisted's handlers do,
    and later ones change nothing (Twisted's would queue a second C{stop},
    which fails with ReactorNotRunning when two signals come in one turn).
    Call it once the reactor runs: Twisted installs its own handlers at start.
    """
    if threading.current_thread() is not threading.main_thread():
        return

    def stop(number, frame):
        if getattr(reactor, "_exitSignal", None) is not None:
            reactor.callFromThread(log.info, "already shutting down; signal {signal} ignored",
                                   signal=signal.Signals(number).name)
            return
        reactor._exitSignal = number  # as Twisted's handler: task.react and twistd read it
        reactor.callFromThread(reactor.stop)

    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, stop)


def ignore_further_stop_signals(reactor):
    """When a signal is stopping the reactor, a second SIGTERM or SIGINT is
    logged and ignored (Twisted's own handler would try to stop the stopping
    reactor and log a traceback); other stops change nothing."""
    if getattr(reactor, "_exitSignal", None) is None:
        return
    if threading.current_thread() is not threading.main_thread():
        return

    def ignored(number, frame):
        reactor.callFromThread(log.info, "already shutting down; signal {signal} ignored",
                               signal=signal.Signals(number).name)

    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, ignored)
