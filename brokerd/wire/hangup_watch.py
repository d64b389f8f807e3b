"""Noticing a client that hung up while the broker is not reading from it.

A connection that is not read (the broker is blocked, or the client does not
read what we write) never sees the end of its stream, so a client that sent
half a body and went away would keep what it held counted against the memory
watermark, and the broker blocked, for good. While reading is paused,
L{HangupWatch} asks the socket every second whether the peer closed or reset
its end (Linux's POLLRDHUP reports it even with unread bytes before the end)
and aborts the connection if so, which releases everything it held.

A client that closed its socket while its own unsent bytes wait for our window
sends its FIN only after them, so the end never arrives; a few bytes written to
it make its system answer with a reset, which the next check sees. The
protocol supplies those bytes (C{probe}): a frame its clients ignore.
"""

import select
import socket

from twisted.internet.task import LoopingCall
from twisted.logger import Logger

log = Logger()

HANGUP_CHECK_INTERVAL = 1.0  # seconds between checks while a connection is not read

_HUNG_UP = getattr(select, "POLLRDHUP", 0) | select.POLLHUP | select.POLLERR


def peer_hung_up(transport):
    """True if the peer of C{transport}'s socket closed or reset its end; False when unknown."""
    handle = getattr(transport, "getHandle", None)
    sock = handle() if handle is not None else None
    if not isinstance(sock, socket.socket) or sock.fileno() < 0:
        return False
    if hasattr(select, "POLLRDHUP"):
        poller = select.poll()
        poller.register(sock.fileno(), _HUNG_UP)
        return any(events & _HUNG_UP for _, events in poller.poll(0))
    try:  # elsewhere: an end with no unread bytes before it, or an error, can still be seen
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


class HangupWatch:
    """
    Checks a paused connection's socket now and then; aborts the connection
    once its peer is gone.
    """

    def __init__(self, transport, clock, probe=None, interval=HANGUP_CHECK_INTERVAL):
        """C{probe()}, if given, is called after each check that found the peer still there."""
        self._transport = transport
        self._probe = probe
        self._interval = interval
        self._loop = LoopingCall(self._check)
        self._loop.clock = clock

    def start(self):
        if not self._loop.running:
            self._loop.start(self._interval, now=False)

    def stop(self):
        if self._loop.running:
            self._loop.stop()

    def _check(self):
        if peer_hung_up(self._transport):
            self.stop()
            peer = self._transport.getPeer()
            log.info(
                "{peer} hung up while it was not being read: dropping its connection", peer=peer
            )
            self._transport.abortConnection()
        elif self._probe is not None:
            self._probe()
