"""Stopping the broker without breaking a promise made to a client.

On SIGTERM the listeners stop first (no new connections), then every client
connection stops being read (no new publishes), the commits already under way
finish and their publisher confirms go out, and only then does each client get
the connection's close, with RabbitMQ's reply: C{320 CONNECTION_FORCED - broker
forced connection closure with reason 'shutdown'} (clients such as pika and
aio-pika reconnect on it). Reading resumes then, so that a client's close-ok
ends its connection at once (what else it sent is dropped unread, as after any
connection.close); a client that has not answered within L{SHUTDOWN_GRACE_SECONDS}
is dropped (RabbitMQ does not wait at all). The stores close after that.
"""

from twisted.internet import defer
from twisted.internet.task import deferLater
from twisted.logger import Logger

from brokerd.errors import ConnectionForced
from brokerd.storage.durability import is_out_of_space
from brokerd.wire.backpressure import reading_pauses

log = Logger()

SHUTDOWN_REASON = "broker forced connection closure with reason 'shutdown'"  # RabbitMQ 3.10's text
SHUTDOWN_GRACE_SECONDS = 1.0  # how long clients have to answer the close before they are dropped
SHUTTING_DOWN = "shutting down"  # the reason the broker stops reading from every client
_DISCONNECT_POLL_SECONDS = 0.02
# A confirm's sync may be requested in the same reactor turn as ours: wait for one more.
_COMMIT_ROUNDS = 2


def _open_protocols(factories):
    return [protocol for factory in factories for protocol in factory.open_protocols()]


def _connected(protocol):
    transport = protocol.transport
    return transport is not None and not getattr(transport, "disconnected", True)


@defer.inlineCallbacks
def close_clients(reactor, stores, factories, grace=SHUTDOWN_GRACE_SECONDS):
    """
    Close every client connection of C{factories} (server factories with
    C{open_protocols()} and C{close_connections(error)}) once the commits in
    flight in C{stores} (the broker's and the vhosts' own) are done and
    confirmed; fires when all are gone.
    """
    protocols = _open_protocols(factories)
    if not protocols:
        return
    log.info("shutting down: closing {count} client connection(s)", count=len(protocols))
    for protocol in protocols:
        reading_pauses(protocol.transport).pause(SHUTTING_DOWN)
    for _ in range(_COMMIT_ROUNDS):
        # A confirm-mode channel asks for its sync at the end of a turn; the
        # sync made after it fires after it.
        yield deferLater(reactor, 0, lambda: None)
        try:
            yield defer.gatherResults([store.sync() for store in stores], consumeErrors=True)
        except defer.FirstError as error:
            if is_out_of_space(error.subFailure):  # logged by the store: the disk is full
                log.warn("a store failed its last commit before shutdown: {problem}",
                         problem=error.subFailure.getErrorMessage())
            else:
                log.failure("a store failed its last commit before shutdown", error.subFailure)
            break
        except Exception:
            log.failure("a store failed its last commit before shutdown")
            break
    error = ConnectionForced(SHUTDOWN_REASON)
    for factory in factories:
        factory.close_connections(error)
    for protocol in protocols:
        if protocol.transport is not None:
            reading_pauses(protocol.transport).resume(SHUTTING_DOWN)
    deadline = reactor.seconds() + grace
    while reactor.seconds() < deadline and any(_connected(protocol) for protocol in protocols):
        yield deferLater(reactor, _DISCONNECT_POLL_SECONDS, lambda: None)
    late = [protocol for protocol in protocols if _connected(protocol)]
    if late:
        log.info(
            "dropping {count} client connection(s) that did not answer the close"
            " within {seconds} s",
            count=len(late), seconds=grace,
        )
        for protocol in late:
            protocol.transport.abortConnection()
