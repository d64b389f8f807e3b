"""Synthetic run directories for the Spark job's tests: what a workload run
writes (L{spark_jobs.events}), made by hand so every timestamp is known and
faults can be planted one at a time.

L{SyntheticRun} plays a small scenario, the same for every label unless a
fault is planted: two publishers of 20 messages each, one every 0.1 s,
alternating; queue C{q0} gets the even seqs, C{q1} the odd ones, and every
fifth seq also goes to C{parked}, which nobody reads. C{consumer-0} reads
C{q0}, C{consumer-1} reads C{q1}. The broker is killed after 24 publishes
and restarted 0.5 s later (epoch 1, every client in session 1). On the way:
one message confirmed with basic.nack and never delivered; the last message
before the crash never confirmed and lost; a delivery nacked with requeue
and redelivered; one rejected; one acked before the crash whose ack the
crash lost (delivered again, flagged, and left unacked, so it is stored);
one delivered unacked before the crash and redelivered after it; the last
delivery unacked at the end (stored). A correct analysis finds nothing wrong
in it. The run spans about 4.5 s; a C{time_scale} squeezes or stretches every
time since C{T0} (0.1: the same run in under half a second).

Faults (each changes one message, named in L{FAULT_MESSAGES}):
L{SyntheticRun.plant_duplicate}, L{SyntheticRun.plant_reorder},
L{SyntheticRun.plant_lost_message}, L{SyntheticRun.plant_body_mismatch},
L{SyntheticRun.plant_redelivery_after_ack}, L{SyntheticRun.plant_stored_after_last_ack}.
"""

import hashlib
import json
import pathlib
from dataclasses import dataclass, field

from spark_jobs import events
from spark_jobs.settings import WorkloadSettings

T0 = 1_700_000_000.0
PUBLISH_GAP = 0.1
RESTART_GAP = 0.5
PUBLISHERS = 2
PER_PUBLISHER = 20
CRASH_AFTER = 24  # publishes before the SIGKILL
SIZES = (64, 1024, 16384)
QUEUES = ("q0", "q1")
PARKED = "parked"
CONSUMER_OF_QUEUE = {"q0": 0, "q1": 1}

# Publish positions (k: the k-th publish of the run, publishers alternating).
NACKED_BY_BROKER = 5  # publisher 1 seq 2, q0
UNCONFIRMED_LOST = 23  # publisher 1 seq 11, q1: the last publish before the crash
NACK_REQUEUED = 2  # publisher 0 seq 1, q1
REJECTED = 6  # publisher 0 seq 3, q1
ACK_LOST_TO_CRASH = 20  # publisher 0 seq 10, parked and q0
UNACKED_AT_CRASH = 22  # publisher 0 seq 11, q1
UNACKED_AT_END = 39  # publisher 1 seq 19, q1

# The message each fault is planted on.
FAULT_MESSAGES = {
    "duplicate": "p0-000000004",  # k 8, q0
    "reorder": "p0-000000002",  # k 4, q0: delivered after p0-000000004
    "lost": "p0-000000007",  # k 14, q1
    "body_mismatch": "p0-000000005",  # k 10, parked and q1
    "redelivery_after_ack": "p0-000000006",  # k 12, q0
    "stored_after_last_ack": "p0-000000015",  # k 30, parked and q1, epoch 1
}


def position(message_id):
    """The publish position k of a message id of this scenario."""
    publisher, seq = message_id[1:].split("-")
    return int(seq) * PUBLISHERS + int(publisher)


@dataclass
class Message:
    k: int
    publisher: int
    seq: int
    queues: list
    size: int
    priority: int
    published_at: float
    epoch: int
    confirm: object  # True, False (basic.nack) or None (never confirmed)
    confirm_ms: float
    end_to_end_ms: float

    @property
    def message_id(self):
        return events.message_id(self.publisher, self.seq)

    @property
    def body_sha256(self):
        return hashlib.sha256(f"body of {self.message_id}, {self.size} bytes".encode()).hexdigest()


@dataclass
class Delivery:
    """One entry of a consumer's stream: a delivery and what the consumer did with it."""

    message: Message
    queue: str
    redelivered: bool = False
    settle: str = events.ACK  # or NACK, REJECT, None (left unacked)
    requeue: bool = False
    body_sha256: str = None  # None: the message's own


@dataclass
class Session:
    epoch: int
    deliveries: list = field(default_factory=list)


def _make_message(k):
    publisher, seq = k % PUBLISHERS, k // PUBLISHERS
    queues = [QUEUES[seq % 2]] + ([PARKED] if seq % 5 == 0 else [])
    epoch = 0 if k < CRASH_AFTER else 1
    confirm = {NACKED_BY_BROKER: False, UNCONFIRMED_LOST: None}.get(k, True)
    return Message(
        k=k, publisher=publisher, seq=seq, queues=sorted(queues), size=SIZES[k % len(SIZES)],
        priority=(seq // 4) % 2 if publisher == 1 else 0,
        published_at=T0 + PUBLISH_GAP * k + (RESTART_GAP if epoch else 0.0), epoch=epoch, confirm=confirm,
        confirm_ms=1.0 + (k * 7) % 13, end_to_end_ms=3.0 + (k * 5) % 17,
    )


class SyntheticRun:
    """
    One run directory's worth of events, export and run.json.

    @ivar messages: by message id.
    @ivar sessions: consumer number to its two L{Session}s (epoch 0, epoch 1).
    @ivar stored: C{(message id, queue)} pairs in the export, in order.
    """

    def __init__(self, label, time_scale=1.0):
        self.label = label
        self.time_scale = time_scale
        self.messages = {}
        for k in range(PUBLISHERS * PER_PUBLISHER):
            message = _make_message(k)
            self.messages[message.message_id] = message
        self.sessions = {consumer: [Session(0), Session(1)] for consumer in CONSUMER_OF_QUEUE.values()}
        self.stored = []
        self.extra_stored = []
        by_k = {message.k: message for message in self.messages.values()}
        # Recovered at the restart: delivered before the crash and not (durably) acked.
        for k in (ACK_LOST_TO_CRASH, UNACKED_AT_CRASH):
            message = by_k[k]
            queue = self._consumed_queue(message)
            self.sessions[CONSUMER_OF_QUEUE[queue]][1].deliveries.append(
                Delivery(message, queue, redelivered=True, settle=None if k == ACK_LOST_TO_CRASH else events.ACK))
        for message in sorted(self.messages.values(), key=lambda message: message.k):
            if message.k in (NACKED_BY_BROKER, UNCONFIRMED_LOST):
                continue
            queue = self._consumed_queue(message)
            stream = self.sessions[CONSUMER_OF_QUEUE[queue]][message.epoch].deliveries
            if message.k == NACK_REQUEUED:
                stream.append(Delivery(message, queue, settle=events.NACK, requeue=True))
                stream.append(Delivery(message, queue, redelivered=True))
            elif message.k == REJECTED:
                stream.append(Delivery(message, queue, settle=events.REJECT))
            elif message.k in (UNACKED_AT_CRASH, UNACKED_AT_END):
                stream.append(Delivery(message, queue, settle=None))
            else:
                stream.append(Delivery(message, queue))
        for message in sorted(self.messages.values(), key=lambda message: message.k):
            if PARKED in message.queues and message.confirm:
                self.stored.append((message.message_id, PARKED))
        self.stored.append((by_k[ACK_LOST_TO_CRASH].message_id, "q0"))
        self.stored.append((by_k[UNACKED_AT_END].message_id, "q1"))

    @staticmethod
    def _consumed_queue(message):
        return next(queue for queue in message.queues if queue != PARKED)

    def _entry(self, message_id, epoch=None):
        message = self.messages[message_id]
        epoch = message.epoch if epoch is None else epoch
        for session in self.sessions[CONSUMER_OF_QUEUE[self._consumed_queue(message)]]:
            for index, delivery in enumerate(session.deliveries):
                if session.epoch == epoch and delivery.message is message:
                    return session.deliveries, index
        raise KeyError(message_id)

    # Faults: each touches the one message FAULT_MESSAGES names.

    def plant_duplicate(self):
        """A second delivery of a message, before its ack, not flagged redelivered."""
        stream, index = self._entry(FAULT_MESSAGES["duplicate"])
        first = stream[index]
        stream.insert(index + 1, Delivery(first.message, first.queue))
        first.settle = None

    def plant_reorder(self):
        """A message delivered right after its publisher's next one in the same queue."""
        stream, index = self._entry(FAULT_MESSAGES["reorder"])
        moved = stream.pop(index)
        following = next(position for position in range(index, len(stream))
                         if stream[position].message.publisher == moved.message.publisher)
        stream.insert(following + 1, moved)

    def plant_lost_message(self):
        """A confirmed message that was never delivered and is not stored."""
        stream, index = self._entry(FAULT_MESSAGES["lost"])
        del stream[index]

    def plant_body_mismatch(self):
        """A delivery whose body is not the published one."""
        stream, index = self._entry(FAULT_MESSAGES["body_mismatch"])
        stream[index].body_sha256 = hashlib.sha256(b"a damaged body").hexdigest()

    def plant_redelivery_after_ack(self):
        """An acked message delivered again (flagged) by the same broker."""
        stream, index = self._entry(FAULT_MESSAGES["redelivery_after_ack"])
        stream.insert(index + 1, Delivery(stream[index].message, stream[index].queue, redelivered=True))

    def plant_stored_after_last_ack(self):
        """A message acked in the last epoch, and still in the export."""
        message_id = FAULT_MESSAGES["stored_after_last_ack"]
        self.extra_stored.append((message_id, self._consumed_queue(self.messages[message_id])))

    # Rendering.

    def publisher_events(self, publisher):
        lines = []
        for message in self.messages.values():
            if message.publisher != publisher:
                continue
            common = {"client": f"publisher-{publisher}", "session": message.epoch, "epoch": message.epoch}
            lines.append({**common, "kind": events.PUBLISH, "t": message.published_at,
                          "message_id": message.message_id, "publisher": publisher, "seq": message.seq,
                          "exchange": "amq.direct", "routing_key": message.queues[0], "queues": message.queues,
                          "size": message.size, "body_sha256": message.body_sha256, "priority": message.priority,
                          "confirm": True})
            if message.confirm is not None:
                lines.append({**common, "kind": events.CONFIRM, "t": message.published_at + message.confirm_ms / 1000,
                              "message_id": message.message_id, "publisher": publisher, "seq": message.seq,
                              "ok": message.confirm})
        lines.sort(key=lambda line: line["t"])
        return lines

    def consumer_events(self, consumer):
        lines = []
        for session_number, session in enumerate(self.sessions[consumer]):
            session_start = T0 + PUBLISH_GAP * CRASH_AFTER + RESTART_GAP if session.epoch else T0
            now = session_start
            for tag, delivery in enumerate(session.deliveries, start=1):
                message = delivery.message
                common = {"client": f"consumer-{consumer}", "session": session_number, "epoch": session.epoch,
                          "message_id": message.message_id, "queue": delivery.queue, "consumer": consumer}
                now = max(message.published_at + message.end_to_end_ms / 1000, now + 0.0002)
                lines.append({**common, "kind": events.DELIVER, "t": now, "delivery_tag": tag,
                              "redelivered": delivery.redelivered, "delivery_count": int(delivery.redelivered),
                              "size": message.size, "body_sha256": delivery.body_sha256 or message.body_sha256})
                if delivery.settle is not None:
                    now += 0.0005
                    lines.append({**common, "kind": delivery.settle, "t": now, "requeue": delivery.requeue})
        return lines

    def export_lines(self):
        lines = []
        for message_id, queue in self.stored + self.extra_stored:
            message = self.messages[message_id]
            lines.append({"backend": self.label, "queue": queue, "message_id": message_id,
                          "body_sha256": message.body_sha256, "size": message.size,
                          "priority": message.priority, "state": events.READY})
        return lines

    def event_files(self):
        """File name to its event dicts, each with C{backend} and C{n} filled in."""
        files = {f"publisher-{publisher}.jsonl": self.publisher_events(publisher) for publisher in range(PUBLISHERS)}
        files.update({f"consumer-{consumer}.jsonl": self.consumer_events(consumer) for consumer in self.sessions})
        for lines in files.values():
            for n, line in enumerate(lines):
                line.update(backend=self.label, n=n, t=T0 + (line["t"] - T0) * self.time_scale)
        return files

    def write(self, run_dir):
        """
        Writes C{run.json}, C{events/*.jsonl} and C{export.jsonl} under C{run_dir}.

        @return: every event written, in file order.
        """
        run_dir = pathlib.Path(run_dir)
        (run_dir / events.EVENTS_DIRECTORY).mkdir(parents=True, exist_ok=True)
        written = []
        for name, lines in self.event_files().items():
            write_lines(run_dir / events.EVENTS_DIRECTORY / name, lines)
            written.extend(lines)
        write_lines(run_dir / events.EXPORT_FILE, self.export_lines())
        first, last = min(line["t"] for line in written), max(line["t"] for line in written)
        settings = WorkloadSettings(messages=PUBLISHERS * PER_PUBLISHER, queues=len(QUEUES), publishers=PUBLISHERS,
                                    max_priority=1, crash_every=CRASH_AFTER)
        (run_dir / events.RUN_FILE).write_text(json.dumps({
            "backend": self.label, "label": self.label, "seed": settings.seed, "settings": settings.to_json(),
            "started": first, "finished": last, "wall_seconds": last - first + 0.25, "crashes": 1,
        }))
        return written


def write_lines(path, lines):
    with open(path, "w") as file:
        for line in lines:
            file.write(json.dumps(line) + "\n")
