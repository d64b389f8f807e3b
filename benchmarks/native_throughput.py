"""Publish and consume throughput over the native protocol.

    python -m benchmarks.native_throughput --messages 200000 --size 100

Starts ``twistd -n brokerd --backend=memory`` as a subprocess (or uses
``--connect``) and measures, with one client connection per role:

  publish   N messages with publisher confirms, at most --window unconfirmed;
            the rate counts until the last confirm
  consume   the N queued messages with prefetch --prefetch and one multiple
            ack per --ack-every deliveries
  together  a consumer running while N more are published; the rate counts
            until the last one is consumed

Every phase checks that each message arrived exactly once, in order. Next to
each rate it prints how many cores the broker process kept busy over that phase
(CPU seconds over wall seconds, from /proc: 1.0 is one core busy throughout);
with ``--connect`` only when ``--broker-pid`` names the broker's process on this
machine, otherwise "n/a" (null in ``--json``).
"""

import argparse
import sys
import tempfile
import time

from twisted.internet import defer, task

from benchmarks.report import print_results
from brokerd.loadgen.process_cpu import CpuWindow
from brokerd.native.client import connect

QUEUE = "benchmark"


class Publisher:
    """Publishes numbered messages keeping at most C{window} unconfirmed."""

    def __init__(self, channel, count, size, window):
        self.channel = channel
        self.count = count
        self.window = window
        self.padding = b"x" * max(0, size - 8)
        self.sent = 0
        self.confirmed = 0
        self.done = defer.Deferred()

    def start(self):
        self._fill()
        return self.done

    def _fill(self):
        channel, padding = self.channel, self.padding
        while self.sent < self.count and self.sent - self.confirmed < self.window:
            body = self.sent.to_bytes(8, "big") + padding
            channel.basic_publish("", QUEUE, body).addCallbacks(self._confirmed, self._failed)
            self.sent += 1

    def _confirmed(self, _):
        self.confirmed += 1
        if self.confirmed == self.count:
            self.done.callback(self.count)
        elif self.sent - self.confirmed <= self.window // 2:
            self._fill()

    def _failed(self, failure):
        if not self.done.called:
            self.done.errback(failure)


class Consumer:
    """Counts deliveries, checks their order, acks one multiple per C{ack_every}."""

    def __init__(self, channel, expected, ack_every, first_number=0):
        self.channel = channel
        self.expected = expected
        self.ack_every = ack_every
        self.next_number = first_number
        self.received = 0
        self.done = defer.Deferred()

    def on_delivery(self, delivery):
        number = int.from_bytes(delivery.body[:8], "big")
        if number != self.next_number and not self.done.called:
            self.done.errback(AssertionError(f"expected message {self.next_number}, got {number}"))
            return
        self.next_number += 1
        self.received += 1
        if self.received % self.ack_every == 0 or self.received == self.expected:
            self.channel.basic_ack(delivery.delivery_tag, multiple=True)
        if self.received == self.expected and not self.done.called:
            self.done.callback(self.received)


@defer.inlineCallbacks
def measure(reactor, endpoint, messages, size, window, prefetch, ack_every, broker_pid=None):
    """
    Run the three phases; fires with a dict of rates in messages per second and,
    for each, the cores process C{broker_pid} kept busy meanwhile (None without it).
    """
    publisher_connection = yield connect(reactor, endpoint, client_name="benchmark-publisher")
    consumer_connection = yield connect(reactor, endpoint, client_name="benchmark-consumer")
    try:
        publishing = yield publisher_connection.channel()
        consuming = yield consumer_connection.channel()
        yield publishing.queue_declare(QUEUE)
        yield publishing.queue_purge(QUEUE)
        yield publishing.confirm_select()
        yield consuming.basic_qos(prefetch)
        results = {"messages": messages, "size": size}

        broker_cpu = CpuWindow(broker_pid).start()
        started = time.perf_counter()
        yield Publisher(publishing, messages, size, window).start()
        results["publish_per_s"] = messages / (time.perf_counter() - started)
        results["publish_broker_cpu"] = broker_cpu.cores_busy()

        consumer = Consumer(consuming, messages, ack_every)
        broker_cpu = CpuWindow(broker_pid).start()
        started = time.perf_counter()
        tag = yield consuming.basic_consume(QUEUE, consumer.on_delivery)
        yield consumer.done
        results["consume_per_s"] = messages / (time.perf_counter() - started)
        results["consume_broker_cpu"] = broker_cpu.cores_busy()
        yield consuming.basic_cancel(tag)

        consumer = Consumer(consuming, messages, ack_every)
        tag = yield consuming.basic_consume(QUEUE, consumer.on_delivery)
        broker_cpu = CpuWindow(broker_pid).start()
        started = time.perf_counter()
        yield Publisher(publishing, messages, size, window).start()
        yield consumer.done
        results["together_per_s"] = messages / (time.perf_counter() - started)
        results["together_broker_cpu"] = broker_cpu.cores_busy()
        yield consuming.basic_cancel(tag)
        return results
    finally:
        yield publisher_connection.close()
        yield consumer_connection.close()


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100, help="body bytes (at least 8)")
    parser.add_argument("--window", type=int, default=5000, help="most unconfirmed publishes")
    parser.add_argument("--prefetch", type=int, default=1000)
    parser.add_argument("--ack-every", type=int, default=100)
    parser.add_argument("--connect", help="endpoint of a running broker (default: start one)")
    parser.add_argument("--broker-pid", type=int, metavar="PID",
                        help="with --connect: the process id of that broker, when it runs on this machine, so its"
                             " CPU use is reported (otherwise n/a)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    return parser


def main(argv=None):
    parser = build_parser()
    options = parser.parse_args(argv)
    if options.broker_pid is not None and not options.connect:
        parser.error("--broker-pid goes with --connect (a broker this benchmark starts is read anyway)")
    broker = None
    endpoint, broker_pid = options.connect, options.broker_pid
    if endpoint is None:
        from brokerd.testing import BrokerProcess

        broker = BrokerProcess(["--backend=memory", "--native", "tcp:0:interface=127.0.0.1"],
                               cwd=tempfile.mkdtemp(prefix="brokerd-bench-"))
        endpoint = broker.wait_listening("native protocol")
        broker_pid = broker.process.pid
    try:
        results = {}

        def run(reactor):
            d = measure(reactor, endpoint, options.messages, options.size, options.window, options.prefetch,
                        options.ack_every, broker_pid)
            return d.addCallback(results.update)

        _react(run)
    finally:
        if broker is not None:
            broker.stop()
    print_results(results, "the native protocol", options.json)
    return results


def _react(function):
    """task.react without exiting the process, so main() can clean up after it."""
    try:
        task.react(function)
    except SystemExit as exit_:
        if exit_.code:
            raise


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
