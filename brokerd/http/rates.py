"""Per-second rates of message counters, as the management API's C{*_details.rate} fields show them.

RabbitMQ samples its counters every C{collect_statistics_interval} (5 s) and
gives rates over the last samples, so what a client reads does not depend on
how many others look. L{CounterRates} does the same without a timer: it
takes a new sample when someone looks and the last is at least
L{SAMPLE_INTERVAL} old, and measures the rate from the sample before that,
so a rate covers 5 to 10 seconds (less only in the first seconds after the
first look) however often the dashboard, C{rabbitmqadmin} and a scraper ask.
"""

SAMPLE_INTERVAL = 5.0  # seconds, RabbitMQ's default collect_statistics_interval


class CounterRates:
    """The rates of a fixed tuple of counters, from samples taken when looked at."""

    __slots__ = ("_previous", "_latest")

    def __init__(self, now, counts):
        self._previous = None
        self._latest = (now, counts)

    def rates(self, now, counts):
        """
        The counters' change per second up to C{now}, when they read C{counts};
        a tuple of floats.
        """
        latest = self._latest
        if now - latest[0] >= SAMPLE_INTERVAL:
            self._previous, self._latest = latest, (now, counts)
        since, before = self._previous or latest
        elapsed = now - since
        # The common case of an idle queue, without the arithmetic:
        if elapsed <= 0 or counts == before:
            return (0.0,) * len(counts)
        return tuple([(count - old) / elapsed for count, old in zip(counts, before)])
