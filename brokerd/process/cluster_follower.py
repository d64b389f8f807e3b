"""A follower's link to the leader of the moment: connects, applies, and tries again."""

from twisted.internet import defer
from twisted.logger import Logger

from brokerd.replication.follower import ReplicationClient
from brokerd.replication.in_sync import no_delay
from brokerd.wire.client_endpoints import client_endpoint

log = Logger()

RETRY_SECONDS = 0.5
CONNECT_TIMEOUT = 5


class FollowerLink:
    """
    Keeps this follower's L{StoreApplier} fed by the leader at the address L{follow} was
    last given: a link that closes or cannot be made is tried again after
    C{RETRY_SECONDS}, resuming after the last operation applied.

    @ivar address: the leader's replication address (C{tcp:HOST:PORT}, or C{tls:HOST:PORT},
        whose certificate is checked against C{trust_roots}, else the system's), or None.
    @ivar client: the L{ReplicationClient} of the current attempt, or None.
    """

    def __init__(self, reactor, applier, secret, node_name, trust_roots=None):
        self.reactor = reactor
        self.applier = applier
        self.secret = secret
        self.node_name = node_name
        self.trust_roots = trust_roots
        self.address = None
        self.client = None
        self.connections = 0
        self._attempt = None
        self._retry = None

    def follow(self, address):
        """Follow the leader at C{address} from now on (None: follow none)."""
        if address == self.address:
            return
        self.address = address
        self._drop()
        if address is not None:
            self._connect()

    def stop(self):
        """Follow none; fires once the current link is closed."""
        self.address = None
        client = self.client
        self._drop()
        return client.when_lost() if client is not None else defer.succeed(None)

    def _connect(self):
        self._retry = None
        address = self.address
        client = self.client = ReplicationClient(self.applier, self.secret, self.node_name)
        client.noisy = False  # a follower tries every RETRY_SECONDS while the leader is away
        description = f"{address}:timeout={CONNECT_TIMEOUT}"
        if address.startswith("tls:") and self.trust_roots:
            description += f":trustRoots={self.trust_roots}"
        try:
            endpoint = client_endpoint(self.reactor, description)
        except ValueError as problem:  # the leader published an address no client can use
            log.warn("cannot follow the leader at {address}: {problem}", address=address,
                     problem=problem)
            return self._again()
        self._attempt = endpoint.connect(client)
        self._attempt.addCallbacks(self._connected, self._not_connected,
                                   callbackArgs=(client, address), errbackArgs=(client, address))

    def _connected(self, protocol, client, address):
        self._attempt = None
        no_delay(protocol.transport)
        self.connections += 1
        client.when_lost().addCallback(self._lost, client, address)

    def _not_connected(self, failure, client, address):
        self._attempt = None
        if client is self.client and address == self.address:
            log.info("cannot reach the leader at {address}: {problem}", address=address,
                     problem=failure.getErrorMessage())
            self._again()

    def _lost(self, reason, client, address):
        if client is self.client and address == self.address:
            self._again()

    def _again(self):
        if self._retry is None or not self._retry.active():
            self._retry = self.reactor.callLater(RETRY_SECONDS, self._connect)

    def _drop(self):
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        if self._attempt is not None:
            self._attempt.cancel()
            self._attempt = None
        if self.client is not None and self.client.link is not None:
            self.client.link.transport.abortConnection()
        self.client = None
