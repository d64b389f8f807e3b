"""Delivery acknowledgement timeouts: RabbitMQ's C{consumer_timeout}.

A delivery (to a consumer, or by basic.get) that its client has not acked,
nacked or rejected within the timeout closes its channel with RabbitMQ's 406
PRECONDITION_FAILED and text; closing the channel requeues what it held, so the
message goes to another consumer, flagged redelivered. The timeout is the
broker's (C{--consumer-timeout}, RabbitMQ's 30 minutes by default), or the
queue's own: the lower of its C{x-consumer-timeout} argument and its policy's
C{consumer-timeout} key (RabbitMQ has those from 3.12; 3.10 has the broker's
only).

One timer checks every channel (L{AckTimeouts}); nothing is timed per message.
It runs four times per shortest timeout in force, and at least once a minute
(RabbitMQ checks once a minute), so a delivery is timed out between its timeout
and one and a half times it (once a minute past it, for timeouts over four minutes).
"""

from twisted.logger import Logger

from brokerd.errors import PreconditionFailed

log = Logger()

DEFAULT_CONSUMER_TIMEOUT = 1800000  # milliseconds: RabbitMQ's consumer_timeout
LONGEST_CHECK_INTERVAL = 60.0  # seconds
CHECKS_PER_TIMEOUT = 4


def timed_out(channel_id, timeout):
    """RabbitMQ's error for a delivery on channel C{channel_id} un-acked past C{timeout} ms."""
    return PreconditionFailed(
        f"delivery acknowledgement on channel {channel_id} timed out. Timeout value used:"
        f" {timeout} ms. This timeout value can be configured, see consumers doc guide to"
        " learn more"
    )


class AckTimeouts:
    """
    The timer that closes the channels holding a delivery un-acked past its timeout.

    @ivar default: the broker's timeout in milliseconds, or None (only queues
        that set one have one).
    """

    def __init__(self, broker, default=DEFAULT_CONSUMER_TIMEOUT):
        """
        @param broker: the L{brokerd.model.broker.Broker} whose connections are checked.
        """
        self.broker = broker
        self.default = default
        self._call = None

    def start(self):
        self._schedule(self.shortest())

    def stop(self):
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None

    def shortest(self):
        """The shortest timeout in force, in milliseconds (the broker's or a queue's), or None."""
        shortest = self.default
        for vhost in list(self.broker.vhosts.values()):
            for queue in list(vhost.queues.values()):
                timeout = queue.policy.consumer_timeout
                if timeout is not None and (shortest is None or timeout < shortest):
                    shortest = timeout
        return shortest

    def _schedule(self, shortest=None):
        interval = LONGEST_CHECK_INTERVAL
        if shortest is not None:
            interval = min(interval, max(shortest / 1000 / CHECKS_PER_TIMEOUT, 0.01))
        self._call = self.broker.clock.callLater(interval, self._check)

    def _check(self):
        shortest = self.shortest()
        try:
            if shortest is not None:
                self.check(shortest)
        finally:
            self._schedule(shortest)

    def check(self, shortest):
        """Close each channel that holds a delivery past its timeout (C{shortest} ms the least)."""
        now = self.broker.clock.seconds()
        timeout_of = self._timeout_of
        for connection in list(self.broker.connections):
            for channel in list(connection.channels.values()):
                timeout = channel.deliveries.overdue(now, shortest / 1000, timeout_of)
                if timeout is not None:
                    log.warn(
                        "a delivery on channel {channel} of {connection} was not acknowledged"
                        " within {timeout} ms: closing the channel",
                        channel=channel.id, connection=connection.name, timeout=timeout,
                    )
                    connection.close_channel_by_broker(channel.id, timed_out(channel.id, timeout))

    def _timeout_of(self, entry):
        own = entry.queue.policy.consumer_timeout
        return self.default if own is None else own
