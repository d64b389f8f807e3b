"""Run directories for the Spark job at any size, written without a broker:
what a clean workload run leaves (L{spark_jobs.events}), millions of messages
in a minute or two, so the job can be measured at scale
(L{benchmarks.validation_spark}) without waiting for the workload's clients.

    python -m benchmarks.synthetic_runs --messages 2000000 --out DIR [--backends sqlite,filelog,chunked]

Every run plays the same messages (same ids, routes and bodies, as one seed
does on every backend); only the latencies differ, drawn per label. The
scenario is one a correct broker could have produced, so the job passes
every check on it: two publishers with confirms, two consumers each reading
all four consumed queues, message C{k} routed to queue C{k mod 4}, every
second one to the next queue too and every fourth one to a parked queue
nobody reads (the export holds those); one delivery in 50 nacked with requeue
and redelivered, one in 100 rejected. That is about five events a message:
publish, confirm, and per consumed queue a deliver and its settle.
"""

import argparse
import hashlib
import json
import pathlib
import random
import sys
import time
import zlib
from collections import deque
from concurrent.futures import ProcessPoolExecutor

from spark_jobs import events
from spark_jobs.settings import WorkloadSettings

PUBLISHERS, CONSUMERS = 2, 2
QUEUES = ("q0", "q1", "q2", "q3")
PARKED = "parked"
EXCHANGE = "validation.direct"
SIZES = (64, 1024, 16384)
NACK_EVERY, NACK_AT = 50, 7  # message k with k % 50 == 7: its first delivery is nacked, then redelivered
REJECT_EVERY, REJECT_AT = 100, 13
T0 = 1_700_000_000.0
PUBLISH_RATE = 5000.0  # messages a second, all publishers together
CONFIRM_MS = (0.5, 20.0)
DELIVER_MS = (1.0, 40.0)
SETTLE_MS = 0.2
DEFAULT_BACKENDS = "sqlite,filelog,chunked"


def routes(k):
    """The sorted queues message C{k} is routed to."""
    queues = {QUEUES[k % len(QUEUES)]}
    if k % 2 == 0:
        queues.add(QUEUES[(k + 1) % len(QUEUES)])
    if k % 4 == 0:
        queues.add(PARKED)
    return sorted(queues)


def settings(messages):
    """The L{WorkloadSettings} these runs stand for, for their run.json."""
    return WorkloadSettings(messages=messages, sizes=SIZES, queues=len(QUEUES), parked_queues=1,
                            exchange_types=("direct",), publishers=PUBLISHERS, consumers=CONSUMERS,
                            nack_share=1 / NACK_EVERY, reject_share=1 / REJECT_EVERY)


class _EventFile:
    """One client's event file: lines in the runner's layout, C{n} counting from 0."""

    def __init__(self, path, label, client):
        self.file = open(path, "w", encoding="ascii", buffering=1 << 22)
        self.prefix = f'"backend":"{label}","client":"{client}","session":0,"epoch":0,"n":'
        self.n = 0

    def write(self, kind, t, rest):
        self.file.write(f'{{"kind":"{kind}",{self.prefix}{self.n},"t":{t!r},{rest}}}\n')
        self.n += 1

    def close(self):
        self.file.close()


def write_run(run_dir, label, messages):
    """
    Writes one run of C{messages} messages under C{run_dir}: run.json,
    events/*.jsonl and export.jsonl.

    @return: the number of events written.
    """
    run_dir = pathlib.Path(run_dir)
    (run_dir / events.EVENTS_DIRECTORY).mkdir(parents=True, exist_ok=True)
    jitter = random.Random(zlib.crc32(label.encode()))
    publishers = [_EventFile(run_dir / events.EVENTS_DIRECTORY / f"publisher-{number}.jsonl", label,
                             f"publisher-{number}") for number in range(PUBLISHERS)]
    consumers = [_EventFile(run_dir / events.EVENTS_DIRECTORY / f"consumer-{number}.jsonl", label,
                            f"consumer-{number}") for number in range(CONSUMERS)]
    pending = [deque() for _ in publishers]  # per publisher: (confirm time, confirm fields) not yet written
    last_confirm = [0.0] * PUBLISHERS
    consumer_clock = [0.0] * CONSUMERS
    delivery_tags = [0] * CONSUMERS
    with open(run_dir / events.EXPORT_FILE, "w", encoding="ascii", buffering=1 << 22) as export:
        for k in range(messages):
            publisher, seq = k % PUBLISHERS, k // PUBLISHERS
            message_id = events.message_id(publisher, seq)
            size = SIZES[k % len(SIZES)]
            sha = hashlib.sha256(f"{message_id}:{size}".encode()).hexdigest()
            queues = routes(k)
            published_at = T0 + k / PUBLISH_RATE
            file, waiting = publishers[publisher], pending[publisher]
            while waiting and waiting[0][0] <= published_at:
                file.write(events.CONFIRM, *waiting.popleft())
            file.write(events.PUBLISH, published_at, (
                f'"message_id":"{message_id}","publisher":{publisher},"seq":{seq},"exchange":"{EXCHANGE}",'
                f'"routing_key":"{queues[0]}","queues":{json.dumps(queues, separators=(",", ":"))},'
                f'"size":{size},"body_sha256":"{sha}","priority":0,"confirm":true'))
            # A publisher's confirms come in publish order (basic.ack with multiple).
            last_confirm[publisher] = max(published_at + jitter.uniform(*CONFIRM_MS) / 1000, last_confirm[publisher])
            waiting.append((last_confirm[publisher],
                            f'"message_id":"{message_id}","publisher":{publisher},"seq":{seq},"ok":true'))
            consumed = [queue for queue in queues if queue != PARKED]
            for index, queue in enumerate(consumed):
                consumer = (k // 2 + index) % CONSUMERS  # as many deliveries for each
                if index == 0 and k % NACK_EVERY == NACK_AT:
                    plan = ((False, events.NACK, "true"), (True, events.ACK, "false"))
                elif index == 0 and k % REJECT_EVERY == REJECT_AT:
                    plan = ((False, events.REJECT, "false"),)
                else:
                    plan = ((False, events.ACK, "false"),)
                file = consumers[consumer]
                for redelivered, settle, requeue in plan:
                    t = max(published_at + jitter.uniform(*DELIVER_MS) / 1000, consumer_clock[consumer] + 1e-5)
                    delivery_tags[consumer] += 1
                    file.write(events.DELIVER, t, (
                        f'"message_id":"{message_id}","queue":"{queue}","consumer":{consumer},'
                        f'"delivery_tag":{delivery_tags[consumer]},"redelivered":{"true" if redelivered else "false"},'
                        f'"delivery_count":{int(redelivered)},"size":{size},"body_sha256":"{sha}"'))
                    t += SETTLE_MS / 1000
                    file.write(settle, t, f'"message_id":"{message_id}","queue":"{queue}","consumer":{consumer},'
                                          f'"requeue":{requeue}')
                    consumer_clock[consumer] = t
            if PARKED in queues:
                export.write(f'{{"backend":"{label}","vhost":"/","queue":"{PARKED}","exchange":"{EXCHANGE}",'
                             f'"message_id":"{message_id}","body_sha256":"{sha}","size":{size},"priority":0,'
                             f'"state":"{events.READY}"}}\n')
    for file, waiting in zip(publishers, pending):
        while waiting:
            file.write(events.CONFIRM, *waiting.popleft())
    written = sum(file.n for file in publishers + consumers)
    for file in publishers + consumers:
        file.close()
    first, last = T0, max(max(last_confirm), max(consumer_clock), T0)
    (run_dir / events.RUN_FILE).write_text(json.dumps({
        "kind": events.BACKEND_RUN, "backend": label, "label": label, "seed": 1,
        "settings": settings(messages).to_json(),
        "topology": {"exchanges": {EXCHANGE: "direct"}, "queues": list(QUEUES), "parked": [PARKED]},
        "started": first - 1.0, "ended": last + 1.0, "workload_started": first, "workload_ended": last,
        "wall_seconds": last - first, "crashes": [], "synthetic": True, "events": written,
    }, indent=1) + "\n")
    return written


def write_runs(out, labels, messages, processes=None):
    """
    Writes a run of C{messages} messages for every label under C{<out>/runs/}, in parallel processes.

    @return: label to the number of events its run holds.
    """
    runs = pathlib.Path(out) / "runs"
    with ProcessPoolExecutor(max_workers=processes) as pool:
        counts = pool.map(write_run, [runs / label for label in labels], labels, [messages] * len(labels))
        return dict(zip(labels, counts))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.synthetic_runs",
                                     description="Write clean synthetic runs for the validation's Spark job.")
    parser.add_argument("--messages", type=int, default=2_000_000, help="messages per run (about 5 events each)")
    parser.add_argument("--backends", default=DEFAULT_BACKENDS, help="run labels, comma-separated")
    parser.add_argument("--out", required=True, type=pathlib.Path, help="runs go to OUT/runs/LABEL/")
    arguments = parser.parse_args(argv)
    started = time.monotonic()
    counts = write_runs(arguments.out, arguments.backends.split(","), arguments.messages)
    print(json.dumps({"events": counts, "seconds": round(time.monotonic() - started, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
