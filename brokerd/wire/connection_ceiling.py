"""The broker's ceiling on client connections (C{--connection-max}, RabbitMQ's C{connection_max}).

One L{ConnectionCeiling} counts the open connections of every client
listener (AMQP, AMQPS, the native protocol); each listener accepts through a
L{CeilingFactory}, which closes a new connection's socket at once, before a
byte is read, while the ceiling is reached, and logs it (the first refusal,
then one line per interval while they go on). RabbitMQ's listeners (Ranch)
stop accepting instead and leave the connections waiting in the kernel's
backlog until a place is free; an immediate close lets a client fail fast and
retry. Nothing is counted when there is no ceiling.
"""

from twisted.internet.protocol import Factory
from twisted.logger import Logger

log = Logger()

REFUSAL_LOG_INTERVAL = 10.0  # seconds between two log lines about connections turned away


class ConnectionCeiling:
    """
    At most C{maximum} open connections over the factories it is told of.

    @ivar maximum: the ceiling (0: none are accepted).
    @ivar refused: connections turned away since start.
    """

    def __init__(self, maximum, clock):
        self.maximum = maximum
        self.clock = clock
        self.refused = 0
        self._factories = []
        self._logged_at = None
        self._unlogged = 0

    def watch(self, factory):
        """Count the open connections of C{factory} (one with C{open_protocols()})."""
        self._factories.append(factory)

    def open_connections(self):
        return sum(len(factory.open_protocols()) for factory in self._factories)

    def admits(self, address):
        """Whether one more connection, from C{address}, is under the ceiling (logged if not)."""
        if self.open_connections() < self.maximum:
            return True
        self.refused += 1
        now = self.clock.seconds()
        if self._logged_at is None or now - self._logged_at >= REFUSAL_LOG_INTERVAL:
            log.warn(
                "connection from {peer} turned away: {maximum} connections are open"
                " (--connection-max); {count} turned away since the last such line",
                peer=getattr(address, "host", address), count=self._unlogged + 1,
                maximum=self.maximum,
            )
            self._logged_at, self._unlogged = now, 0
        else:
            self._unlogged += 1
        return False


class CeilingFactory(Factory):
    """A listener's factory that hands each connection under the ceiling to the real one."""

    noisy = False

    def __init__(self, factory, ceiling):
        self.factory = factory
        self.ceiling = ceiling
        ceiling.watch(factory)

    def logPrefix(self):
        """The real factory's name, which its listener's log lines go on showing."""
        return type(self.factory).__name__

    def doStart(self):
        self.factory.doStart()

    def doStop(self):
        self.factory.doStop()

    def buildProtocol(self, address):
        if not self.ceiling.admits(address):
            return None  # Twisted closes the socket
        return self.factory.buildProtocol(address)
