"""The running broker as a Twisted service: store first, then listeners.

L{BrokerService} opens the store and recovers durable state before any
listener accepts a client, and on stop closes the listeners, then the clients'
connections, then the store. A start-up failure (store unusable, port taken) is
logged in one line and ends the process with exit status 1.
"""

import json
import os
import sys

from twisted.application.service import Service
from twisted.internet import defer
from twisted.internet.endpoints import serverFromString
from twisted.logger import Logger

from brokerd.amqp.server import AmqpServerFactory
from brokerd.model.broker import Broker
from brokerd.model.watermark import DEFAULT_HIGH_WATERMARK, MemoryWatermark
from brokerd.native.server import DEFAULT_CHANNEL_MAX, DEFAULT_MAX_FRAME_SIZE, NativeServerFactory

log = Logger()


class Listener:
    """One endpoint string and the factory serving it; logs the bound address."""

    def __init__(self, reactor, description, factory, label):
        self.reactor = reactor
        self.description = description
        self.factory = factory
        self.label = label
        self.port = None

    @defer.inlineCallbacks
    def start(self):
        self.port = yield serverFromString(self.reactor, self.description).listen(self.factory)
        return self.port

    def announce(self):
        address = self.port.getHost()
        where = f"{address.host}:{address.port}" if hasattr(address, "port") else str(address)
        log.info("{label} listening on {where}", label=self.label, where=where)

    def stop(self):
        port, self.port = self.port, None
        return port.stopListening() if port is not None else None


class BrokerService(Service):
    """
    Store, broker and listeners, started in that order.

    @ivar started: a Deferred firing with this service once every listener is
        up (or failing if start-up failed); useful to tests and embedders.
    """

    def __init__(
        self,
        store,
        reactor,
        native_endpoint=None,
        native_max_frame_size=DEFAULT_MAX_FRAME_SIZE,
        native_channel_max=DEFAULT_CHANNEL_MAX,
        amqp_endpoint=None,
        amqp_settings=None,
        memory_high_watermark=DEFAULT_HIGH_WATERMARK,
    ):
        self.store = store
        self.reactor = reactor
        self.broker = Broker(store, reactor, watermark=MemoryWatermark(memory_high_watermark))
        self.listeners = []
        if amqp_endpoint:
            factory = AmqpServerFactory(self.broker, amqp_settings)
            self.listeners.append(Listener(reactor, amqp_endpoint, factory, "AMQP"))
        if native_endpoint:
            factory = NativeServerFactory(self.broker, native_max_frame_size, native_channel_max)
            self.listeners.append(Listener(reactor, native_endpoint, factory, "native protocol"))
        self.started = defer.Deferred()

    def startService(self):
        Service.startService(self)
        d = defer.maybeDeferred(self.store.open)
        d.addCallback(lambda _: self.broker.recover())
        d.addCallback(lambda _: defer.gatherResults([listener.start() for listener in self.listeners], consumeErrors=True))
        d.addCallback(lambda _: self.reactor.callWhenRunning(self._ready))
        d.addErrback(self._failed_to_start)

    def _ready(self):
        # Announced once the reactor runs (and has its signal handlers), so a
        # supervisor that starts talking to us or stops us from here on is safe.
        for listener in self.listeners:
            listener.announce()
        self.started.callback(self)

    def _failed_to_start(self, failure):
        failure = failure.value.subFailure if isinstance(failure.value, defer.FirstError) else failure
        log.critical("brokerd could not start: {problem}", problem=failure.getErrorMessage() or failure.type.__name__)
        self.started.errback(failure)
        self.started.addErrback(lambda _: None)
        self.reactor.callWhenRunning(self._stop_after_failure)

    def _stop_after_failure(self):
        self.reactor.addSystemEventTrigger("after", "shutdown", _exit_with_failure)
        self.reactor.stop()

    @defer.inlineCallbacks
    def stopService(self):
        Service.stopService(self)
        for listener in self.listeners:
            yield listener.stop()
        for connection in list(self.broker.connections):
            connection.close()
        self.broker.stop()
        yield self.store.close()
        log.info("store stats at stop: {stats}", stats=json.dumps(self.store.stats(), sort_keys=True))


def _exit_with_failure():
    # twistd has no way to set its exit status; this runs after the reactor stops.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
