"""Bounded logging of the clients refused before they logged in, for both wire protocols.

A listener shares one L{RefusalLog} among its connections: the first refusal
is one line, and while refusals keep coming, one summary line per
L{REFUSAL_LOG_INTERVAL} says how many there were and where they came from, so
a flood of failed logins (AMQP) or bad first frames (native) cannot flood the log.
"""

import collections

from twisted.logger import Logger

log = Logger()

# Refusals before login are logged as one line, then at most one summary line
# (how many more, from where) per this many seconds.
REFUSAL_LOG_INTERVAL = 10.0
REFUSAL_LOG_PEERS = 1024  # distinct addresses counted per summary; more are counted as "other"


class RefusalLog:
    """
    Logs the connections refused before login, shared by all connections of a
    listener: the first refusal as one line, then, while refusals keep coming,
    one line per L{REFUSAL_LOG_INTERVAL} with how many there were and the
    addresses they came from, so a flood of failed logins cannot flood the log.
    The native protocol's listener has one too, for clients refused before hello.
    """

    def __init__(self, interval=REFUSAL_LOG_INTERVAL, protocol="AMQP", before="login"):
        self.interval = interval
        self.protocol = protocol  # the protocol and the handshake step named in the lines
        self.before = before
        self._window = None  # the call that ends the current interval, while one runs
        self._peers = collections.Counter()  # host -> refusals not logged yet
        self._unlisted = 0  # refusals from hosts beyond REFUSAL_LOG_PEERS
        self._last = None

    def refused(self, clock, host, peer, error):
        """
        Log (now or in the next summary) that C{peer} (at C{host}) was refused
        with C{error}, an error or a text.
        """
        if self._window is None:
            log.info(
                "refused {protocol} client {peer} before {before}: {error}",
                protocol=self.protocol, peer=peer, before=self.before, error=error,
            )
            self._window = clock.callLater(self.interval, self._summarise, clock)
            return
        if host in self._peers or len(self._peers) < REFUSAL_LOG_PEERS:
            self._peers[host] += 1
        else:
            self._unlisted += 1
        self._last = (peer, error)

    def stop(self):
        """The listener stopped: no more summaries (refusals not yet summarised are dropped)."""
        if self._window is not None and self._window.active():
            self._window.cancel()
        self._window = None
        self._peers.clear()
        self._unlisted = 0

    def _summarise(self, clock):
        count = sum(self._peers.values()) + self._unlisted
        if not count:
            self._window = None
            return
        hosts = ", ".join(f"{host} ({number})" for host, number in self._peers.most_common(5))
        if len(self._peers) > 5 or self._unlisted:
            listed = sum(number for _, number in self._peers.most_common(5))
            hosts += f" and {count - listed} from other addresses"
        peer, error = self._last
        log.info(
            "refused {count} more {protocol} clients before {before}"
            " in the last {seconds:.0f} s, from {hosts}; the last, {peer}: {error}",
            count=count, protocol=self.protocol, before=self.before, seconds=self.interval,
            hosts=hosts, peer=peer, error=error,
        )
        self._peers.clear()
        self._unlisted = 0
        self._window = clock.callLater(self.interval, self._summarise, clock)
