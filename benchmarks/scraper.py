"""A monitoring load for the throughput benchmarks: what a Prometheus server and a dashboard ask, on a timer.

L{Scraper} asks a broker's C{/metrics}, C{/metrics/per-object}, C{/api/overview}
and C{/api/queues} once every C{interval} seconds on a thread, over one
keep-alive connection per listener (as Prometheus does), while the benchmark
runs, and counts the rounds it made and the bytes it read; a failed request
is kept and raised when it stops, so a broken endpoint fails the benchmark.
"""

import base64
import http.client
import threading
import time

PATHS = (("prometheus", "/metrics"), ("prometheus", "/metrics/per-object"), ("http", "/api/overview"),
         ("http", "/api/queues"))


class Scraper:
    """Scrapes a broker's metrics and management API every C{interval} seconds until L{stop}."""

    def __init__(self, http_address, prometheus_address, interval, user="guest", password="guest"):
        self.addresses = {"http": http_address, "prometheus": prometheus_address}
        self.interval = interval
        self.authorization = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.rounds = 0
        self.bytes_read = 0
        self._stopping = threading.Event()
        self._problem = None
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)

    def start(self):
        self._thread.start()
        return self

    def stop(self):
        """Stop after the current round; raises what made a request fail, if anything did."""
        self._stopping.set()
        self._thread.join()
        if self._problem is not None:
            raise self._problem

    def _run(self):
        connections = {name: http.client.HTTPConnection(*address, timeout=60)
                       for name, address in self.addresses.items()}
        try:
            next_round = time.monotonic()
            while not self._stopping.is_set():
                for listener, path in PATHS:
                    self.bytes_read += self._get(connections[listener], path)
                self.rounds += 1
                next_round += self.interval
                self._stopping.wait(max(0.0, next_round - time.monotonic()))
        except Exception as problem:  # noqa: BLE001 - reported by stop()
            self._problem = problem
        finally:
            for connection in connections.values():
                connection.close()

    def _get(self, connection, path):
        connection.request("GET", path, headers={"Authorization": self.authorization})
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"GET {path}: HTTP {response.status} {body[:200]!r}")
        return len(body)
