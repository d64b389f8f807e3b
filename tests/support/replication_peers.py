"""Hand-driven replication peers for hostile-input tests: a raw client or server on a real socket
that sends exactly the bytes a test gives, and, when asked, does its half of the handshake with
the real HMAC proofs so that what it sends next arrives after authentication."""

from twisted.internet import defer, endpoints, protocol, reactor

from brokerd.replication import auth, codec
from tests.support.broker import wait_until


class RawPeer(protocol.Protocol):
    """Keeps every byte received and every frame decoded; notes when the connection closes."""

    def __init__(self):
        self.received = bytearray()
        self.frames = []
        self.closed = False
        self._decoder = codec.FrameDecoder(codec.DEFAULT_FRAME_LIMIT)

    def dataReceived(self, data):
        self.received += data
        self.frames.extend(self._decoder.feed(data))

    def connectionLost(self, reason):
        self.closed = True

    def send(self, data):
        self.transport.write(data)

    def kinds(self):
        return [kind for kind, _ in self.frames]

    def wait_closed(self, timeout=5):
        return wait_until(lambda: self.closed, timeout=timeout)

    def wait_frames(self, count, timeout=5):
        return wait_until(lambda: len(self.frames) >= count or self.closed, timeout=timeout)


@defer.inlineCallbacks
def connect_raw(address):
    """A L{RawPeer} connected to C{address} (a leader's port)."""
    endpoint = endpoints.TCP4ClientEndpoint(reactor, address.host, address.port)
    peer = yield endpoints.connectProtocol(endpoint, RawPeer())
    return peer


@defer.inlineCallbacks
def authenticated_follower(address, secret, node="rogue", cluster="c1", epoch=0, sequence=0):
    """A L{RawPeer} that answered the leader's challenge like a follower; fires once welcomed."""
    peer = yield connect_raw(address)
    yield peer.wait_frames(1)
    kind, payload = peer.frames[0]
    assert kind == codec.HELLO, kind
    leader_nonce, nonce = payload[len(codec.MAGIC):], auth.nonce()
    proof = auth.follower_proof(secret, leader_nonce, nonce, cluster, node, epoch, sequence, 0)
    peer.send(codec.frame(codec.AUTH, codec.encode_auth(nonce, proof, epoch, sequence, 0, cluster,
                                                        node)))
    yield peer.wait_frames(2)
    assert peer.frames[1][0] == codec.WELCOME, peer.frames
    return peer


class FakeLeader(protocol.Protocol):
    """
    Plays a leader's handshake with C{secret} (or with C{proof_secret} for its own
    proof), then sends C{script}, the bytes a test wants the follower to receive.
    """

    def __init__(self, factory):
        self.factory = factory
        self.closed = False
        self._decoder = codec.FrameDecoder()
        self._nonce = auth.nonce()

    def connectionMade(self):
        self.factory.peers.append(self)
        self.transport.write(codec.frame(codec.HELLO, codec.MAGIC + self._nonce))

    def dataReceived(self, data):
        for kind, payload in self._decoder.feed(data):
            if kind == codec.AUTH:
                follower_nonce = codec.decode_auth(payload)[0]
                factory = self.factory
                mac = auth.leader_proof(factory.proof_secret, self._nonce, follower_nonce,
                                        factory.cluster, factory.epoch, ())
                self.transport.write(codec.frame(codec.WELCOME, codec.encode_welcome(
                    mac, factory.epoch, (), factory.cluster)) + factory.script)

    def connectionLost(self, reason):
        self.closed = True


class FakeLeaderFactory(protocol.Factory):

    def __init__(self, secret, script, *, proof_secret=None, cluster="c1", epoch=1):
        self.secret, self.script, self.cluster, self.epoch = secret, script, cluster, epoch
        self.proof_secret = proof_secret or secret
        self.peers = []

    def buildProtocol(self, addr):
        return FakeLeader(self)


@defer.inlineCallbacks
def listen_fake_leader(testcase, factory):
    port = yield endpoints.TCP4ServerEndpoint(reactor, 0, interface="127.0.0.1").listen(factory)
    testcase.addCleanup(port.stopListening)
    return port


def operation_frame(sequence, operation, record, body=b""):
    """One whole operation frame, for a script."""
    return b"".join(codec.operation_parts(sequence, operation, record, body))
