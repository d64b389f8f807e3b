"""What the workload runner and its client processes share while a run goes on:
where the broker listens now, the publish gate that times the crashes, the
stop signal for consumers, and per-client counters for progress. What each
client writes down of its own is in L{spark_jobs.client_logs}.
"""

# Per-client counters, one row of these per client in L{RunControl.counters}.
# CPU_MS: the client process's CPU time, in milliseconds, from the moment it was ready to its end.
PUBLISHED, CONFIRMED, BROKER_NACKED, DELIVERED, ACKED, NACKED, REJECTED, SESSIONS, CPU_MS = range(9)
COUNTER_NAMES = ("published", "confirmed", "nacked_by_broker", "delivered", "acked", "nacked",
                 "rejected", "sessions", "cpu_ms")


class RunControl:
    """
    State shared through multiprocessing between the runner and its clients.

    Publishers take permission for each publish from the gate (L{claim}) and
    say when they made them (L{published}). The gate stays shut until every
    client is connected and ready, so that no crash comes before all of them
    are there. The runner sets how many publishes are allowed in all, and the
    publish that reaches that limit sets C{gate_reached}. The runner then
    kills the broker, restarts it, publishes its new address (L{set_broker})
    and opens the gate further (L{open_gate}). So a crash comes after exactly
    N publishes, while the clients' windows are still in flight.

    @ivar all_ready: set once every client is ready (L{client_ready}).
    @ivar gate_reached: set once every allowed publish was made.
    @ivar stop: set by the runner when consumers should close and exit.
    @ivar clients: how many client rows the counters have (publishers first, then consumers).
    """

    def __init__(self, context, clients):
        self._broker = context.Array("q", 2)  # epoch, port
        self._claimed = context.Value("q", 0)
        self._published = context.RawValue("q", 0)  # guarded by the lock of _claimed
        self._ready = context.Value("q", 0)
        self._limit = context.RawValue("q", 0)
        self.gate_reached = context.Event()
        self.all_ready = context.Event()
        self.stop = context.Event()
        self.clients = clients
        self._counts = context.RawArray("q", clients * len(COUNTER_NAMES))
        self._failures = context.SimpleQueue()

    def broker(self):
        """C{(epoch, port)} of the broker incarnation that listens now."""
        with self._broker.get_lock():
            return self._broker[0], self._broker[1]

    def set_broker(self, epoch, port):
        with self._broker.get_lock():
            self._broker[0], self._broker[1] = epoch, port

    def client_ready(self):
        """A client's first session is set up (publishing channel ready, consumers consuming)."""
        with self._ready.get_lock():
            self._ready.value += 1
            if self._ready.value == self.clients:
                self.all_ready.set()

    @property
    def ready_clients(self):
        with self._ready.get_lock():
            return self._ready.value

    def claim(self, wanted):
        """Permission for up to C{wanted} publishes; how many were granted (0 while the gate is
        shut)."""
        with self._claimed.get_lock():
            granted = max(0, min(wanted, self._limit.value - self._claimed.value))
            self._claimed.value += granted
        return granted

    def published(self, count):
        """C{count} claimed publishes went out; the last one before the limit sets
        C{gate_reached}."""
        with self._claimed.get_lock():
            self._published.value += count
            if self._published.value >= self._limit.value:
                self.gate_reached.set()

    @property
    def claimed(self):
        """Publishes granted so far over all publishers."""
        with self._claimed.get_lock():
            return self._claimed.value

    @property
    def published_total(self):
        """Publishes made so far over all publishers (claimed ones still being sent not counted)."""
        with self._claimed.get_lock():
            return self._published.value

    def open_gate(self, limit):
        """Allow publishes up to C{limit} in all (counted from the start of the run)."""
        with self._claimed.get_lock():
            self.gate_reached.clear()
            self._limit.value = limit

    def report_failure(self, client, text):
        """A client says why it failed, for the runner's error message."""
        self._failures.put((client, text))

    def failures(self):
        """Every C{(client name, text)} reported so far."""
        found = []
        while not self._failures.empty():
            found.append(self._failures.get())
        return found

    def count(self, client, counter, amount=1):
        """Add to one of client C{client}'s counters (only that client's process writes its row)."""
        self._counts[client * len(COUNTER_NAMES) + counter] += amount

    def counters(self, client):
        """Client C{client}'s counters as a dict."""
        start = client * len(COUNTER_NAMES)
        return dict(zip(COUNTER_NAMES, self._counts[start:start + len(COUNTER_NAMES)]))

    def total(self, counter):
        """One counter summed over all clients."""
        width = len(COUNTER_NAMES)
        return sum(self._counts[counter::width])
