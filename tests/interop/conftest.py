"""The client-library tests' fixtures (L{tests.support.client_broker}): a broker
subprocess per module, pika connections and channels, names, watchdogs and the
broker-log checks."""

from tests.support.client_broker import (  # noqa: F401 (fixtures, found by name)
    amqp_broker,
    broker,
    channel,
    connect,
    connection,
    name,
    no_broker_tracebacks,
    own_broker,
    watchdog,
)
