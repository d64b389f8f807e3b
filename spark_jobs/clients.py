"""The workload's clients, whichever AMQP library carries their frames: each
publisher and each consumer is one OS process with one connection to the
broker, so that clients and broker share the machine's cores and no client
waits a round trip per message. L{spark_jobs.fast_clients} drives the
pipelining raw-socket client (the default: it costs a fraction of what the
broker does), L{spark_jobs.pika_clients} drives pika; both log the same events
(L{spark_jobs.client_logs}).

A publisher sends its planned messages as persistent messages with their id as
the AMQP message-id, keeping up to L{PUBLISH_WINDOW} unconfirmed. A consumer
consumes every consumed queue with manual acks and settles each delivery as the
plan decides. When the broker dies under them they reconnect to its next
incarnation, one session later. A publisher does not send again what was
unconfirmed at the crash: those messages may be lost, and the run's checks only
expect confirmed ones to stay.

This module holds what both libraries' clients share: their configuration
(L{ClientConfig}), their pacing, the consumer tags that name the consumed
queues, and the process entry that reports a failure to the runner.
"""

import traceback
from dataclasses import dataclass

# Most unconfirmed publishes per publisher (without confirms: publishes between barriers).
PUBLISH_WINDOW = 1000
# Publishes taken from the gate at once; small, so a crash lands close to its boundary.
CLAIM_BATCH = 100
GATE_POLL = 0.005  # seconds between looks at a shut gate
STOP_POLL = 0.05  # seconds between a consumer's looks at the stop signal
# Seconds a client keeps trying to reach the broker (a big store recovers slowly).
RECONNECT_DEADLINE = 600.0
RECONNECT_BACKOFF = 0.05  # seconds between attempts to connect


class ClientFailed(RuntimeError):
    """A client could not go on: the broker stayed away, or closed a channel on it."""


@dataclass(frozen=True)
class ClientConfig:
    """What every client process of a run needs to know, small enough to hand to a new process: the
    run's label, settings and events directory, and where and as whom to log in (the port comes from
    the run's L{RunControl<spark_jobs.control.RunControl>}, one per broker incarnation)."""

    backend: str
    settings: dict
    events_dir: str
    host: str = "127.0.0.1"
    username: str = "guest"
    password: str = "guest"
    virtual_host: str = "/"


def consumer_tags(name, topology):
    """C{(consumer tag, queue)} of each queue consumer C{name} consumes: the tag names the queue its
    deliveries come from."""
    return [(f"{name}/{queue}", queue) for queue in topology.queues]


def run_client(sessions, log, control):
    """
    Runs a client's C{sessions} (in its own process) to their end, then closes
    its L{ClientLog<spark_jobs.client_logs.ClientLog>} C{log}; a failure is
    reported to the runner's C{control}, then raised.
    """
    try:
        try:
            sessions.run()
        finally:
            log.close()
    except BaseException as failure:
        control.report_failure(log.name, "".join(traceback.format_exception(failure)).rstrip())
        raise
