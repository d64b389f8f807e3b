"""Publish and consume throughput over AMQP 0-9-1.

    python -m benchmarks.amqp_throughput --messages 200000 --size 100

Starts ``twistd -n brokerd --backend=memory --amqp tcp:0:interface=127.0.0.1
--native none`` as a subprocess (or uses ``--connect HOST:PORT``) and measures,
with one AMQP connection per role:

  publish   N messages with publisher confirms, at most --window unconfirmed;
            the rate counts until the last confirm
  consume   the N queued messages with prefetch --prefetch and one multiple
            basic.ack per --ack-every deliveries; the rate counts until the
            last delivery
  together  a consumer running while N more are published; the rate counts
            until the last one is consumed (and every publish confirmed)

``--queue-type`` says what is measured: ``transient`` (the default) a
non-durable queue and transient messages; ``classic`` a durable queue and
persistent messages; ``quorum`` a durable queue declared with
``x-queue-type: quorum`` and persistent messages, as RabbitMQ's quorum queues
are compared (``--connect`` to a RabbitMQ node runs the same load there). A
broker the benchmark starts keeps durable queues with the chunked backend.

With ``--scrape-every 1`` the broker also serves Prometheus metrics and a
thread scrapes them and the management API every second while it runs (what
monitoring costs); ``--no-management`` starts it without those listeners
(the figure to compare with).

Every phase checks that each message arrived exactly once, in order (each body
starts with its number, 8 bytes big-endian).

Next to each rate it prints how many cores the broker process kept busy over
that phase (its CPU seconds over the phase's wall seconds, from /proc: 1.0 is
one core busy throughout); with ``--connect`` only when ``--broker-pid`` names
the broker's process on this machine, otherwise "n/a" (null in ``--json``).

The client (L{brokerd.loadgen.amqp_client}) pipelines on raw sockets and costs far
less than the broker, so the figures are the broker's, not the client's.
"""

import argparse
import sys
import tempfile
import time

from pamqp import commands

from benchmarks.report import print_results
from benchmarks.scraper import Scraper
from brokerd.loadgen.amqp_client import Connection, Loop
from brokerd.loadgen.amqp_codec import (
    BASIC_ACK,
    LONG_LONG,
    PERSISTENT_PROPERTIES,
    TRANSIENT_PROPERTIES,
    BenchmarkError,
    publish_block,
    settle_frame,
)
from brokerd.loadgen.process_cpu import CpuWindow

QUEUE = "benchmark-amqp"
PHASES = ("publish", "consume", "together")  # what L{measure} runs, in this order
WRITE_BYTES = 256 * 1024  # most bytes of publishes a publisher builds for one write


class QueueType:
    """What one --queue-type measures: the queue's name, durability and arguments, and the messages' properties."""

    def __init__(self, queue, durable, arguments, properties):
        self.queue = queue
        self.durable = durable
        self.arguments = arguments
        self.properties = properties

    def declare(self):
        return commands.Queue.Declare(queue=self.queue, durable=self.durable, arguments=self.arguments)


# Each type has its own queue, so one broker can be measured with each in turn.
QUEUE_TYPES = {
    "transient": QueueType(QUEUE, False, None, TRANSIENT_PROPERTIES),
    "classic": QueueType(f"{QUEUE}-classic", True, None, PERSISTENT_PROPERTIES),
    "quorum": QueueType(f"{QUEUE}-quorum", True, {"x-queue-type": "quorum"}, PERSISTENT_PROPERTIES),
}


class Publisher:
    """
    Publishes numbered messages to C{queue}, at most C{window} unconfirmed. Each
    confirm that frees room is answered with one write of as many publishes as fit.
    """

    def __init__(self, connection, count, size, window, first_number, first_tag, queue=QUEUE,
                 properties=TRANSIENT_PROPERTIES):
        self.connection = connection
        self.count = count
        self.window = window
        self.first_number = first_number
        self.first_tag = first_tag  # the channel's delivery tag for our first publish
        self.sent = 0
        self.confirmed = 0
        self.finished_at = None
        self.block, self.number_offset = publish_block(
            connection.CHANNEL, queue, size, connection.frame_max, properties
        )
        self.pack_number = LONG_LONG.pack_into

    def start(self):
        self.connection.on_confirm = self.on_confirm
        self._fill()

    @property
    def done(self):
        return self.confirmed == self.count

    def _fill(self):
        # Refill on every confirm. Waiting for more free room leaves the client
        # silent, and a broker without TCP_NODELAY then holds its next small
        # confirm write until the client's delayed ACK (about 40 ms on Linux).
        room = min(self.window - (self.sent - self.confirmed), self.count - self.sent)
        if room <= 0:
            return
        block = self.block
        step = len(block)
        pack = self.pack_number
        # Writes of at most WRITE_BYTES each: one huge buffer (a window of 64 KiB messages is
        # 128 MB) costs the client fresh pages and cold caches while the broker waits for it.
        per_write = max(1, WRITE_BYTES // step)
        while room > 0:
            count = min(room, per_write)
            batch = bytearray(block * count)
            number = self.first_number + self.sent
            for at in range(self.number_offset, step * count, step):
                pack(batch, at, number)
                number += 1
            self.sent += count
            room -= count
            self.connection.write(batch)

    def on_confirm(self, channel, delivery_tag, multiple, ack):
        """A basic.ack from the broker: every publish up to C{delivery_tag}, or just that one."""
        if not ack:
            raise BenchmarkError(f"{self.connection.name}: the broker nacked publish {delivery_tag}")
        confirmed = delivery_tag - self.first_tag + 1
        if not multiple and confirmed != self.confirmed + 1:
            raise BenchmarkError(f"publish confirmed out of order: tag {delivery_tag} after {self.confirmed} of ours")
        if confirmed <= self.confirmed or confirmed > self.sent:
            raise BenchmarkError(
                f"confirm for tag {delivery_tag}: {self.confirmed} of ours confirmed, {self.sent} sent"
                f" (our first tag is {self.first_tag})"
            )
        self.confirmed = confirmed
        if confirmed == self.count:
            self.finished_at = time.perf_counter()
            self.connection.on_confirm = self.connection.unexpected_confirm
        else:
            self._fill()


class Consumer:
    """Consumes C{queue}, checks every delivery's number and order; one multiple ack per C{ack_every}."""

    def __init__(self, connection, expected, size, ack_every, first_number, queue=QUEUE):
        self.connection = connection
        self.queue = queue
        self.size = size
        self.expected = expected
        self.ack_every = ack_every
        self.next_number = first_number
        self.received = 0
        self.last_tag = 0
        self.finished_at = None
        self.consumer_tag = None

    def start(self):
        connection = self.connection
        connection.on_delivery = self.on_delivery
        reply = connection.rpc(commands.Basic.Consume(queue=self.queue, no_ack=False), commands.Basic.ConsumeOk)
        self.consumer_tag = reply.consumer_tag

    def cancel(self):
        self.connection.rpc(commands.Basic.Cancel(consumer_tag=self.consumer_tag), commands.Basic.CancelOk)
        self.connection.on_delivery = self.connection.unexpected_delivery

    @property
    def done(self):
        return self.received == self.expected

    def on_delivery(self, delivery):
        delivery_tag, body = delivery.delivery_tag, delivery.body
        if len(body) != self.size:
            raise BenchmarkError(f"delivery {delivery_tag} has {len(body)} bytes, not {self.size}")
        number = int.from_bytes(body[:8], "big")
        if number != self.next_number:
            raise BenchmarkError(f"expected message {self.next_number}, got {number} (delivery tag {delivery_tag})")
        if delivery_tag <= self.last_tag:
            raise BenchmarkError(f"delivery tag {delivery_tag} after {self.last_tag}")
        if self.received == self.expected:
            raise BenchmarkError(f"message {number} delivered after all {self.expected} expected ones")
        self.next_number = number + 1
        self.last_tag = delivery_tag
        self.received += 1
        if self.received % self.ack_every == 0 or self.received == self.expected:
            self.connection.write(settle_frame(self.connection.CHANNEL, delivery_tag, BASIC_ACK, multiple=True))
            if self.received == self.expected:
                self.finished_at = time.perf_counter()


class BrokerCores:
    """A phase's meter: the cores process C{pid} kept busy from L{start} to L{stop} (None without)."""

    def __init__(self, pid):
        self.window = CpuWindow(pid)

    def start(self):
        self.window.start()
        return self

    def stop(self):
        return self.window.cores_busy()


def measure(host, port, messages, size, window, prefetch, ack_every, broker_pid=None, queue_type="transient",
            meter=None, client_name="benchmark", publish_only=False):
    """
    Runs the three phases on the queue of C{queue_type} (a L{QUEUE_TYPES}
    key); returns a dict of rates in messages per second, the publishes
    confirmed and messages consumed in all, and for each phase what its meter
    read (C{PHASE_broker_cpu}): C{meter()} makes one per phase (started just
    before its clock, stopped at its end), by default the cores process
    C{broker_pid} kept busy meanwhile (None without it). With C{publish_only}
    it runs the publish phase alone and then purges the queue, so the broker
    does not carry the backlog into what is measured next.
    """
    meter = meter or (lambda: BrokerCores(broker_pid))
    kind = QUEUE_TYPES[queue_type]
    loop = Loop()
    publishing = Connection(loop, host, port, f"{client_name}-publisher")
    consuming = Connection(loop, host, port, f"{client_name}-consumer")
    try:
        publishing.open()
        consuming.open()
        publishing.rpc(kind.declare(), commands.Queue.DeclareOk)
        publishing.rpc(commands.Queue.Purge(queue=kind.queue), commands.Queue.PurgeOk)
        publishing.rpc(commands.Confirm.Select(), commands.Confirm.SelectOk)
        consuming.rpc(commands.Basic.Qos(prefetch_count=prefetch), commands.Basic.QosOk)
        results = {"messages": messages, "size": size, "queue_type": queue_type, "confirmed": 0, "consumed": 0}

        def publish(first_number, first_tag):
            publisher = Publisher(publishing, messages, size, window, first_number, first_tag, kind.queue,
                                  kind.properties)
            publisher.start()
            return publisher

        # publish: N with confirms, until the last confirm
        broker_cpu = meter().start()
        started = time.perf_counter()
        publisher = publish(0, 1)
        loop.run_until(
            lambda: publisher.done,
            lambda: f"publish phase, {publisher.sent} sent, {publisher.confirmed} confirmed",
            lambda: publisher.confirmed,
        )
        results["publish_broker_cpu"] = broker_cpu.stop()
        results["publish_per_s"] = messages / (publisher.finished_at - started)
        results["confirmed"] += publisher.confirmed
        if publish_only:
            publishing.rpc(commands.Queue.Purge(queue=kind.queue), commands.Queue.PurgeOk)
            publishing.close()
            consuming.close()
            return results

        # consume: the N queued, until the last delivery
        consumer = Consumer(consuming, messages, size, ack_every, 0, kind.queue)
        broker_cpu = meter().start()
        started = time.perf_counter()
        consumer.start()
        loop.run_until(
            lambda: consumer.done, lambda: f"consume phase, {consumer.received} received", lambda: consumer.received
        )
        results["consume_broker_cpu"] = broker_cpu.stop()
        results["consume_per_s"] = messages / (consumer.finished_at - started)
        results["consumed"] += consumer.received
        consumer.cancel()

        # together: a consumer running while N more are published, until the last consumed
        consumer = Consumer(consuming, messages, size, ack_every, messages, kind.queue)
        consumer.start()
        broker_cpu = meter().start()
        started = time.perf_counter()
        publisher = publish(messages, messages + 1)
        loop.run_until(
            lambda: consumer.done and publisher.done,
            lambda: f"together phase, {publisher.sent} sent, {publisher.confirmed} confirmed,"
            f" {consumer.received} received",
            lambda: (consumer.received, publisher.confirmed),
        )
        results["together_broker_cpu"] = broker_cpu.stop()
        results["together_per_s"] = messages / (max(consumer.finished_at, publisher.finished_at) - started)
        results["confirmed"] += publisher.confirmed
        results["consumed"] += consumer.received
        consumer.cancel()
    except BaseException:
        publishing.shut()
        consuming.shut()
        raise
    publishing.close()
    consuming.close()
    return results


def parse_address(text):
    """C{HOST:PORT} (a C{tcp:} prefix, as the broker logs it, is allowed)."""
    if text.startswith("tcp:"):
        text = text[4:]
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host, int(port)


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100, help="body bytes (at least 8)")
    parser.add_argument("--window", type=int, default=2000, help="most unconfirmed publishes")
    parser.add_argument("--prefetch", type=int, default=1000)
    parser.add_argument("--ack-every", type=int, default=100)
    parser.add_argument("--queue-type", choices=sorted(QUEUE_TYPES), default="transient",
                        help="transient: a non-durable queue, transient messages; classic: a durable queue, persistent"
                             " messages; quorum: the same declared with x-queue-type quorum")
    parser.add_argument("--connect", type=parse_address, metavar="HOST:PORT",
                        help="AMQP address of a running broker (default: start one)")
    parser.add_argument("--broker-pid", type=int, metavar="PID",
                        help="with --connect: the process id of that broker, when it runs on this machine, so its"
                             " CPU use is reported (otherwise n/a)")
    parser.add_argument("--scrape-every", type=float, default=0, metavar="SECONDS",
                        help="while measuring, scrape the broker's /metrics, /metrics/per-object, /api/overview and"
                             " /api/queues every SECONDS, as a Prometheus server and a dashboard would")
    parser.add_argument("--no-management", action="store_true",
                        help="start the broker without its HTTP API and metrics listeners (--http none)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    return parser


def broker_arguments(options):
    """The broker's command line for these options: with metrics when scraped, without listeners if asked."""
    backend = "memory" if options.queue_type == "transient" else "chunked"
    arguments = [f"--backend={backend}", "--amqp", "tcp:0:interface=127.0.0.1", "--native", "none"]
    if options.no_management:
        return [*arguments, "--http", "none", "--prometheus", "none"]
    if options.scrape_every:
        return [*arguments, "--prometheus", "tcp:0:interface=127.0.0.1"]
    return arguments


def main(argv=None):
    parser = build_parser()
    options = parser.parse_args(argv)
    if options.size < 8:
        parser.error("--size must be at least 8 (the body starts with the message number)")
    if options.messages < 1 or options.window < 1 or options.ack_every < 1 or options.prefetch < 0:
        parser.error("--messages, --window and --ack-every must be positive, --prefetch not negative")
    if options.prefetch and options.ack_every > options.prefetch:
        parser.error("--ack-every larger than --prefetch would stall the consumer")
    if options.broker_pid is not None and not options.connect:
        parser.error("--broker-pid goes with --connect (a broker this benchmark starts is read anyway)")
    if options.scrape_every and (options.connect or options.no_management):
        parser.error("--scrape-every needs a broker this benchmark starts, with its management listeners")
    broker = scraper = None
    address, broker_pid = options.connect, options.broker_pid
    if address is None:
        from brokerd.testing import BrokerProcess

        broker = BrokerProcess(broker_arguments(options), cwd=tempfile.mkdtemp(prefix="brokerd-bench-"))
        try:
            address = parse_address(broker.wait_listening("AMQP"))
            broker_pid = broker.process.pid
            if options.scrape_every:
                scraper = Scraper(broker.wait_address("HTTP API"), broker.wait_address("Prometheus metrics"),
                                  options.scrape_every)
        except AssertionError as problem:  # it exited, or never said where it listens
            broker.stop()
            print(f"amqp_throughput: {problem}", file=sys.stderr)
            return None
    try:
        if scraper is not None:
            scraper.start()
        results = measure(*address, options.messages, options.size, options.window, options.prefetch,
                          options.ack_every, broker_pid, options.queue_type)
        if scraper is not None:
            scraper.stop()
            results["scrapes"] = scraper.rounds
    except (BenchmarkError, OSError, RuntimeError) as error:
        print(f"amqp_throughput: {error}", file=sys.stderr)
        if broker is not None and broker.process.poll() is not None:
            print(f"the broker exited with {broker.process.returncode}; its output:", file=sys.stderr)
            print("\n".join(broker.output[-50:]), file=sys.stderr)
        return None
    finally:
        if broker is not None:
            broker.stop()
    print_results(results, f"AMQP 0-9-1 to a {options.queue_type} queue", options.json)
    return results


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
