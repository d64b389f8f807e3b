"""Delayed delivery at scale, through the broker: memory held and how late messages fire.

    python -m benchmarks.delayed_delivery [--backend chunked] [--messages 1000000]
        [--max-delay 3600] [--observe 60] [--probe-rate 50] [--probe-max-delay 10]
        [--seed 1] [--json]

Starts ``twistd -n brokerd --backend=B`` on a fresh data directory, declares a
durable ``x-delayed-message`` exchange (routing as direct) bound to a durable
queue, and publishes N persistent messages (the backlog) with pika as fast as
it can, each with an ``x-delay`` drawn uniformly from 0 to --max-delay seconds
and its due time (publish time plus delay, in ms) as its body. A final publish
in confirm mode proves every earlier one is stored. Meanwhile a consumer on its
own connection acks every delivery and records how late it came (delivery time
minus due time). After publishing, the broker's resident memory is read from
/proc, and the consumer keeps observing for --observe seconds while the
backlog fires.

While it watches, probes are published at a steady --probe-rate per second,
confirmed one by one, with delays of 0 to --probe-max-delay seconds; the last
ones are due 2 s before the watch ends, so every probe must come back. Their
lateness is how late messages fire under normal load, with the backlog firing
around them and its windows being loaded from the store. The backlog's own
lateness is counted from the publisher's clock, so it also holds how far the
broker's reading of the burst fell behind the publisher (the broker counts a
delay from when it reads the message, as RabbitMQ does); it is reported apart.
"""

import argparse
import json
import pathlib
import random
import shutil
import struct
import sys
import tempfile
import threading
import time

from benchmarks.store_throughput import resident_megabytes
from brokerd.testing import BrokerProcess

EXCHANGE = "benchmark-delayed"
QUEUE = "benchmark-delayed-due"
DUE = struct.Struct(">Q")
PROBE = b"probe"  # follows the due time in a probe's body
PROBE_MARGIN_S = 2.0  # the last probe is due this long before the watch ends


class LatenessRecorder(threading.Thread):
    """Consumes the due messages on its own connection, noting how late each one is."""

    def __init__(self, port):
        super().__init__(daemon=True)
        self.port = port
        self.lateness = []  # (due in ms since the epoch, milliseconds late, whether it is a probe)
        self.stopping = threading.Event()
        self.ready = threading.Event()
        self.error = None

    def run(self):
        import pika

        try:
            connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", self.port))
            channel = connection.channel()
            channel.basic_qos(prefetch_count=1000)
            self.ready.set()
            for method, _, body in channel.consume(QUEUE, inactivity_timeout=0.2):
                if method is not None:
                    due = DUE.unpack_from(body)[0]
                    self.lateness.append((due, time.time() * 1000 - due, body[DUE.size:] == PROBE))
                    channel.basic_ack(method.delivery_tag)
                if self.stopping.is_set():
                    break
            channel.cancel()
            connection.close()
        except Exception as error:  # reported by the main thread
            self.error = error
            self.ready.set()


def percentile(values, fraction):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def publish_probes(connection, channel, recorder, options):
    """
    Watch for --observe seconds, publishing a probe every 1 / --probe-rate
    seconds (confirmed, as the channel is in confirm mode) for as long as it
    can still be due PROBE_MARGIN_S before the end. Returns how many went out.
    """
    import pika

    generator = random.Random(options.seed + 1)
    max_delay_ms = int(options.probe_max_delay * 1000)
    observe_until = time.time() + options.observe
    last_probe_at = observe_until - options.probe_max_delay - PROBE_MARGIN_S
    interval = 1.0 / options.probe_rate if options.probe_rate > 0 else float("inf")
    next_probe, probes = time.time(), 0
    while time.time() < observe_until and recorder.is_alive():
        now = time.time()
        if next_probe <= now <= last_probe_at:
            delay = generator.randrange(max_delay_ms + 1)
            due = int(time.time() * 1000) + delay
            channel.basic_publish(EXCHANGE, "due", DUE.pack(due) + PROBE,
                                  pika.BasicProperties(delivery_mode=2, headers={"x-delay": delay}))
            probes += 1
            next_probe = max(next_probe + interval, time.time())  # no catching up in a burst after a stall
        wake = next_probe if next_probe <= last_probe_at else observe_until
        connection.process_data_events(time_limit=min(1.0, max(0.0, wake - time.time())))
    return probes


def run(options):
    import pika

    workdir = pathlib.Path(tempfile.mkdtemp(prefix="brokerd-delayed-bench-"))
    data_dir = workdir / "data"
    broker = BrokerProcess(
        [f"--backend={options.backend}", "--data-dir", str(data_dir), "--native", "none",
         "--amqp", "tcp:0:interface=127.0.0.1"],
        cwd=workdir,
    )
    try:
        port = int(broker.wait_listening("AMQP", timeout=120).rsplit(":", 1)[1])
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        channel = connection.channel()
        channel.exchange_declare(EXCHANGE, "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"})
        channel.queue_declare(QUEUE, durable=True)
        channel.queue_bind(QUEUE, EXCHANGE, "due")
        recorder = LatenessRecorder(port)
        recorder.start()
        recorder.ready.wait(30)
        generator = random.Random(options.seed)
        max_delay_ms = int(options.max_delay * 1000)
        started = time.perf_counter()
        for number in range(options.messages):
            delay = generator.randrange(max_delay_ms + 1)
            due = int(time.time() * 1000) + delay
            properties = pika.BasicProperties(delivery_mode=2, headers={"x-delay": delay})
            channel.basic_publish(EXCHANGE, "due", DUE.pack(due), properties)
            if number % 10_000 == 0:
                connection.process_data_events(0)
                if number and options.progress:
                    print(f"{number} published", file=sys.stderr, flush=True)
        channel.confirm_delivery()  # a confirmed publish after all others: every one before it is stored
        due = int(time.time() * 1000) + max_delay_ms
        channel.basic_publish(EXCHANGE, "due", DUE.pack(due), pika.BasicProperties(delivery_mode=2,
                                                                                   headers={"x-delay": max_delay_ms}))
        published_s = time.perf_counter() - started
        published_at = time.time() * 1000
        rss = resident_megabytes(broker.process.pid)
        probes = publish_probes(connection, channel, recorder, options)
        recorder.stopping.set()
        recorder.join(30)
        if recorder.error is not None:
            raise recorder.error
        connection.close()
        backlog = [(due, late) for due, late, probe in recorder.lateness if not probe]
        everything = [late for _, late in backlog]
        lateness = [late for due, late in backlog if due > published_at]  # once publishing was over
        probe_lateness = [late for _, late, probe in recorder.lateness if probe]
        return {
            "backend": options.backend,
            "messages": options.messages,
            "max_delay_s": options.max_delay,
            "publish_s": published_s,
            "publish_per_s": options.messages / published_s,
            "rss_mb_holding_backlog": rss,
            "fired": len(everything),
            "fired_while_publishing": len(everything) - len(lateness),
            "backlog_lateness_all_ms_p99": percentile(everything, 0.99),
            "backlog_lateness_ms_p50": percentile(lateness, 0.50),
            "backlog_lateness_ms_p99": percentile(lateness, 0.99),
            "backlog_lateness_ms_max": max(lateness, default=float("nan")),
            "probe_rate_per_s": options.probe_rate,
            "probe_max_delay_s": options.probe_max_delay,
            "probes_published": probes,
            "probes_fired": len(probe_lateness),
            "lateness_ms_p50": percentile(probe_lateness, 0.50),
            "lateness_ms_p99": percentile(probe_lateness, 0.99),
            "lateness_ms_max": max(probe_lateness, default=float("nan")),
        }
    finally:
        broker.stop(timeout=120)
        shutil.rmtree(workdir, ignore_errors=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="chunked")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--max-delay", type=float, default=3600.0, help="seconds")
    parser.add_argument("--observe", type=float, default=60.0, help="seconds to watch messages fire after publishing")
    parser.add_argument("--probe-rate", type=float, default=50.0, help="probes published per second while watching")
    parser.add_argument("--probe-max-delay", type=float, default=10.0, help="seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--progress", action="store_true")
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args(argv)
    result = run(options)
    if options.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{result['messages']} delayed messages (0-{options.max_delay:g} s) on {options.backend}:")
        print(f"  published in {result['publish_s']:.1f} s ({result['publish_per_s']:,.0f} msg/s)")
        print(f"  broker RSS holding them: {result['rss_mb_holding_backlog']:.0f} MB")
        print(f"  backlog fired: {result['fired']} ({result['fired_while_publishing']} due while publishing, p99 late"
              f" {result['backlog_lateness_all_ms_p99']:.1f} ms from the publisher's clock)")
        print(f"  backlog due after publishing, late from the publisher's clock (the burst's read lag included):"
              f" p50 {result['backlog_lateness_ms_p50']:.1f} ms, p99 {result['backlog_lateness_ms_p99']:.1f} ms,"
              f" max {result['backlog_lateness_ms_max']:.1f} ms")
        print(f"  probes at {options.probe_rate:g}/s (0-{options.probe_max_delay:g} s) while the backlog fired:"
              f" {result['probes_fired']} of {result['probes_published']} fired, lateness"
              f" p50 {result['lateness_ms_p50']:.1f} ms, p99 {result['lateness_ms_p99']:.1f} ms,"
              f" max {result['lateness_ms_max']:.1f} ms")
    return result


if __name__ == "__main__":
    main()
