"""The client side of the crash tests: publishes and consumes until the broker dies.

    python -m crashloop.client --port PORT --queue Q --out DIR --run 1 --seed 7
"""

import argparse
import json
import pathlib
import random
import sys

from brokerd.loadgen.amqp_client import BrokerGone, Connection, Loop
from brokerd.loadgen.amqp_codec import BenchmarkError
from crashloop.logs import ClientLogs
from crashloop.roles import Consumer, Publisher


def run(options):
    """
    Publishes and consumes until the broker goes away or all is done; returns the summary dict.

    Runs in its own process, started by L{crashloop.loop} (and so by
    tests/backends/test_crash_recovery.py) while the broker is SIGKILLed under it: what
    it knows must outlive the broker's death, and nothing it does may keep the
    broker's sockets alive. It opens one connection per publisher and one for
    the consumer, which starts once --consume-after publishes are confirmed so
    that a backlog builds up. Every body carries its id and a checksum, checked
    on every delivery.

    On stdout it prints ``progress CONFIRMED ACKED DELIVERED`` lines as those
    counts grow (the crash loop kills the broker when CONFIRMED reaches its
    target); L{main} then prints the summary as one JSON line: what was sent,
    what was seen and why it stopped, the broker going away (the expected end)
    or everything published and consumed.
    """
    out = pathlib.Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    logs = ClientLogs(out)
    loop = Loop()
    publishers, consumer, connections = [], None, []
    summary = {"run": options.run, "ended": None, "detail": None}
    try:
        for number in range(1, options.publishers + 1):
            connection = Connection(loop, options.host, options.port, f"crash-publisher-{number}")
            connections.append(connection)
            connection.open()
            rng = random.Random(f"{options.seed}/{options.run}/{number}")
            publishers.append(
                Publisher(connection, options.run, number, options.queue, options.messages, options.window, rng,
                          logs.confirmed)
            )
        connection = Connection(loop, options.host, options.port, "crash-consumer")
        connections.append(connection)
        connection.open()
        consumer = Consumer(connection, options.run, options.queue, options.queue + ".markers", options.prefetch,
                            random.Random(f"{options.seed}/{options.run}/consumer"), logs.acked, logs.acks_sent)
        for publisher in publishers:
            publisher.start()
        total = options.publishers * options.messages
        last = [None]

        def progress():
            now = (sum(p.confirmed for p in publishers), consumer.acked_durable, consumer.delivered)
            if now != last[0]:
                last[0] = now
                print("progress %d %d %d" % now, flush=True)
            return now

        def backlog_built():
            progress()
            return all(p.done for p in publishers) or last[0][0] >= options.consume_after

        def done():
            progress()
            return (all(p.done for p in publishers) and consumer.delivered >= total - sum(p.nacked for p in publishers)
                    and consumer.settled)

        loop.run_until(backlog_built, lambda: f"crash client before consuming, progress {last[0]}", progress)
        consumer.start()
        loop.run_until(done, lambda: f"crash client, progress {last[0]}", progress)
        summary["ended"] = "finished"
    except BrokerGone as gone:
        summary["ended"] = "broker-gone"
        summary["detail"] = str(gone)
    except BenchmarkError as error:
        summary["ended"] = "error"
        summary["detail"] = str(error)
    finally:
        for connection in connections:
            connection.shut()
        logs.close()
    summary["publishers"] = {
        p.number: {"sent": p.sent, "confirmed": p.confirmed, "nacked": p.nacked} for p in publishers
    }
    if consumer is not None:
        summary.update(
            delivered=consumer.delivered,
            acked_durable=consumer.acked_durable,
            held=len(consumer.held),
            markers=consumer.markers_sent,
            corrupt=consumer.corrupt,
            problems=consumer.problems + [problem for p in publishers for problem in p.problems],
        )
    return summary


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--queue", required=True, help="durable queue to publish to and consume from")
    parser.add_argument("--out", required=True, help="directory for confirmed.log, acked.log and acks-sent.log")
    parser.add_argument("--run", type=int, default=1, help="run number, part of every message id")
    parser.add_argument("--seed", default="0", help="seeds message sizes, payloads and which deliveries are held")
    parser.add_argument("--publishers", type=int, default=2)
    parser.add_argument("--messages", type=int, default=100_000, help="per publisher")
    parser.add_argument("--window", type=int, default=300, help="most unconfirmed publishes per publisher")
    parser.add_argument("--prefetch", type=int, default=200)
    parser.add_argument("--consume-after", type=int, default=0, help="start consuming after this many confirms")
    return parser


def main(argv=None):
    summary = run(build_parser().parse_args(argv))
    print(json.dumps(summary), flush=True)
    return 0 if summary["ended"] in ("finished", "broker-gone") else 1


if __name__ == "__main__":
    sys.exit(main())
