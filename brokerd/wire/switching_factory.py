"""A listening port whose connections go to whichever factory serves at the moment.

A cluster node listens on its client ports once, for its whole life, so that the
addresses it published stay true: while it follows, its ports relay clients to the
leader; once it leads, the same ports serve them itself. L{SwitchingFactory} is the
port's factory and hands each new connection to the one in place when it arrives.
"""

from twisted.internet.protocol import Factory


class SwitchingFactory(Factory):
    """
    Hands each connection to C{current}'s C{buildProtocol}; with none in place the
    connection is closed before a byte is read (Twisted closes a socket whose factory
    builds no protocol).

    @ivar port: the listening port, once the owner has listened with this factory.
    """

    noisy = False

    def __init__(self, label):
        self.label = label
        self.current = None
        self.port = None

    def logPrefix(self):
        return f"{self.label} port"

    def use(self, factory):
        """Serve the next connections with C{factory} (None: close them), started here."""
        previous, self.current = self.current, factory
        if factory is not None and factory is not previous:
            factory.doStart()
        if previous is not None and previous is not factory:
            previous.doStop()

    def doStop(self):
        self.use(None)

    def buildProtocol(self, address):
        if self.current is None:
            return None
        return self.current.buildProtocol(address)
