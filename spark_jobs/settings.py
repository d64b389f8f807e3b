"""The knobs of a workload run, shared by the runner's and the Spark job's command lines."""

import argparse
from dataclasses import asdict, dataclass, fields

EXCHANGE_TYPES = ("direct", "fanout", "topic", "headers")
CLIENTS = ("fast", "pika")


def _size_list(text):
    """``100,4096,65536`` -> a tuple of body sizes in bytes, each at least 1."""
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"sizes must be comma-separated byte counts, not {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"every size must be at least 1 byte: {text!r}")
    return sizes


def _exchange_type_list(text):
    kinds = tuple(text.split(","))
    unknown = [kind for kind in kinds if kind not in EXCHANGE_TYPES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown exchange types {unknown}; known: {', '.join(EXCHANGE_TYPES)}")
    return kinds


def _share(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a share is a number between 0 and 1, not {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a share is between 0 and 1, not {text}")
    return value


def _count(minimum):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, not {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {text}")
        return value
    return parse


@dataclass(frozen=True)
class WorkloadSettings:
    """One seeded workload: the same settings and seed give the same messages,
    routes and settle decisions on every backend.

    @ivar sizes: body sizes drawn from uniformly, so several sizes make a mix.
    @ivar parked_queues: queues no consumer reads, so the store still holds their
        messages when the run ends and the export has something to show.
    @ivar nack_share: deliveries nacked with requeue (they come back redelivered).
    @ivar reject_share: deliveries rejected without requeue (dropped, or
        dead-lettered where configured).
    @ivar crash_every: SIGKILL and restart the broker after every this many
        publishes; 0 never.
    @ivar client: which client library the publishers and consumers use:
        C{"fast"}, the pipelining raw-socket client, so the run measures the
        broker, or C{"pika"}, so a real client library's behaviour is covered.
    """

    seed: int = 1
    messages: int = 2000
    sizes: tuple = (64, 1024, 16384)
    queues: int = 4
    parked_queues: int = 1
    exchange_types: tuple = EXCHANGE_TYPES
    publishers: int = 2
    consumers: int = 2
    prefetch: int = 50
    nack_share: float = 0.02
    reject_share: float = 0.01
    max_priority: int = 0
    confirm: bool = True
    crash_every: int = 0
    client: str = "fast"

    def to_json(self):
        """A dict for run.json."""
        values = asdict(self)
        values["sizes"] = list(self.sizes)
        values["exchange_types"] = list(self.exchange_types)
        return values

    @classmethod
    def from_json(cls, values):
        known = {field.name for field in fields(cls)}
        values = {key: value for key, value in values.items() if key in known}
        for key in ("sizes", "exchange_types"):
            if key in values:
                values[key] = tuple(values[key])
        return cls(**values)


def add_workload_arguments(parser):
    """Adds one flag per L{WorkloadSettings} field to an argparse parser."""
    default = WorkloadSettings()
    group = parser.add_argument_group("workload")
    group.add_argument("--seed", type=int, default=default.seed, help="the workload's random seed")
    group.add_argument("--messages", type=_count(1), default=default.messages,
                       help="messages published in all")
    group.add_argument("--sizes", type=_size_list, default=default.sizes,
                       help="body sizes in bytes, comma-separated; each message draws one")
    group.add_argument("--queues", type=_count(1), default=default.queues,
                       help="queues consumers read")
    group.add_argument("--parked-queues", type=_count(0), default=default.parked_queues,
                       help="queues nobody reads, left holding messages for the export")
    group.add_argument("--exchange-types", type=_exchange_type_list, default=default.exchange_types,
                       help="exchange types to route through, comma-separated")
    group.add_argument("--publishers", type=_count(1), default=default.publishers,
                       help="publishing connections")
    group.add_argument("--consumers", type=_count(0), default=default.consumers,
                       help="consuming connections")
    group.add_argument("--prefetch", type=_count(1), default=default.prefetch,
                       help="basic.qos prefetch count")
    group.add_argument("--nack-share", type=_share, default=default.nack_share,
                       help="share of deliveries nacked with requeue")
    group.add_argument("--reject-share", type=_share, default=default.reject_share,
                       help="share of deliveries rejected without requeue")
    group.add_argument("--max-priority", type=_count(0), default=default.max_priority,
                       help="x-max-priority of the queues and top message priority; 0 for none")
    group.add_argument("--no-confirm", dest="confirm", action="store_false",
                       help="publish without confirm mode")
    group.add_argument("--client", choices=CLIENTS, default=default.client,
                       help="the publishers' and consumers' AMQP client: fast (pipelining, costs"
                            " far less than the broker) or pika (default %(default)s)")
    group.add_argument("--crash-every", type=_count(0), default=default.crash_every,
                       help="SIGKILL and restart the broker after every N publishes; 0 never")
    return group


def settings_from_arguments(arguments):
    """The L{WorkloadSettings} an argparse namespace from L{add_workload_arguments} holds."""
    values = {field.name: getattr(arguments, field.name) for field in fields(WorkloadSettings)}
    return WorkloadSettings(**values)
