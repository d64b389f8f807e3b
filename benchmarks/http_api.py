"""How fast the HTTP management API lists many queues, through a real broker.

    python -m benchmarks.http_api [--queues 10000] [--repeat 10] [--json]

Starts ``twistd -n brokerd --backend=memory`` (or uses --connect AMQP and
--http addresses of a running one), declares --queues queues over AMQP with
pika, publishes one message to every tenth, then asks ``GET /api/queues``
--repeat times over HTTP as guest and reports the fastest and the median
answer time and the answer's size. The issue's bar: under 100 ms for 10,000
queues.
"""

import argparse
import base64
import json
import statistics
import tempfile
import time
import urllib.request

import pika


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    return parser.parse_args(argv)


def declare(host, port, count):
    connection = pika.BlockingConnection(pika.ConnectionParameters(host, port, connection_attempts=1))
    try:
        channel = connection.channel()
        for number in range(count):
            channel.queue_declare(f"bench-{number:06}", auto_delete=False)
            if number % 10 == 0:
                channel.basic_publish("", f"bench-{number:06}", b"x" * 100)
        channel.queue_declare(f"bench-{0:06}", passive=True)  # a round trip after the last publish
    finally:
        connection.close()


def time_listing(http_port, repeat):
    request = urllib.request.Request(f"http://127.0.0.1:{http_port}/api/queues", headers={
        "Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()})
    times, size, listed = [], 0, 0
    for _ in range(repeat):
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=60) as response:
            raw = response.read()
        times.append(time.perf_counter() - started)
        size = len(raw)
    listed = len(json.loads(raw))
    return times, size, listed


def run(options):
    from brokerd.testing import BrokerProcess

    broker = BrokerProcess(["--backend=memory", "--native", "none"], cwd=tempfile.mkdtemp(prefix="brokerd-bench-"))
    try:
        host, port = broker.wait_address("AMQP")
        _, http_port = broker.wait_address("HTTP API")
        declare(host, port, options.queues)
        times, size, listed = time_listing(http_port, options.repeat)
    finally:
        broker.stop()
    return {"queues": options.queues, "listed": listed, "bytes": size,
            "fastest_ms": round(min(times) * 1000, 1), "median_ms": round(statistics.median(times) * 1000, 1)}


def main(argv=None):
    options = parse_args(argv)
    results = run(options)
    if options.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"GET /api/queues with {results['listed']} queues ({results['bytes']} bytes):"
              f" fastest {results['fastest_ms']} ms, median {results['median_ms']} ms")


if __name__ == "__main__":
    main()
