"""What a workload run leaves on disk: the layout and fields the runner writes,
the store export writes and the Spark job reads.

One run directory per backend or reference broker (``<out>/runs/<label>/``)::

    run.json          the run: backend, seed, settings, times, crashes, topology
    events/*.jsonl    one JSON object per line, one file per client connection role
                      (``publisher-0.jsonl``, ``consumer-3.jsonl``)
    export.jsonl      what the stopped broker's store still holds (not for a reference)
    data/             the broker's data directory (empty for a reference; a cluster's
                      holds one per node, n1/ n2/ n3/, and etcd/)
    broker.log        twistd's log (for a reference: its restart commands' output)

Every event has C{kind}, C{backend}, C{client} (``publisher-0``), C{session} (the
client's connection number, from 0, one more after each reconnect), C{epoch} (the
broker incarnation the client talked to, from 0, one more after each restart),
C{n} (the event's number in its file, from 0: the order the client saw things in,
which equal timestamps cannot give) and C{t} (``time.time()`` seconds when the
client saw or did it). Then, by kind:

  - ``publish``: C{message_id} (``p<publisher>-<seq>``, unique in a run and the same
    on every backend for one seed), C{publisher}, C{seq} (from 0 per publisher),
    C{exchange}, C{routing_key}, C{queues} (sorted names the topology routes it to),
    C{size}, C{body_sha256}, C{priority} (0 when none), C{confirm} (published on a
    confirm-mode channel).
  - ``confirm``: C{message_id}, C{publisher}, C{seq}, C{ok} (basic.ack true,
    basic.nack false).
  - ``deliver``: C{message_id}, C{queue}, C{consumer}, C{delivery_tag},
    C{redelivered}, C{delivery_count} (the x-delivery-count header, 0 when absent),
    C{size}, C{body_sha256}.
  - ``ack``, ``nack``, ``reject``: C{message_id}, C{queue}, C{consumer}, C{requeue}.

A message id travels as the AMQP ``message-id`` property, so deliveries and the
export name the message without decoding its body.

run.json (written by L{spark_jobs.workload}) has C{kind} (L{BACKEND_RUN}: a
brokerd the runner started, with C{backend}, the C{--backend} string; or
L{REFERENCE_RUN}: an AMQP 0-9-1 broker already running elsewhere, with C{url},
its password masked, and C{restart_command}, null when there is none; or
L{CLUSTER_RUN}: three brokerd nodes of one cluster the runner started, with
C{backends} (one per node), C{nodes} (each one's C{name}, C{backend},
C{data_dir} in the run directory, ports and command), C{leader} (the final
leader, whose store is exported), C{lease_ttl}, C{min_isr} and C{failovers}
(per crash the C{killed} leader, the new C{leader}, C{t} and the C{seconds}
until the new leader served); a run.json without C{kind} is a backend run),
C{label} (the C{backend} field of the events), C{notes} (sentences about how
the run differs from what the settings asked, e.g. crashes skipped), C{seed},
C{settings} (C{WorkloadSettings.to_json()}), C{started} and C{ended} (C{time.time()} of
the whole run, broker start and stop included), C{workload_started} (every
client ready, publishing allowed) and C{workload_ended} (the consumed queues
drained), C{wall_seconds} (the workload's span between those two),
C{drain_seconds} (waiting for the consumed queues to empty after the last
publish), C{crashes} (one C{{epoch, t, published_before}} per
SIGKILL, or per restart command of a reference: the epoch killed, when, and
how many publishes all publishers had made by then), C{epochs} (one C{{epoch,
port, started, listening_seconds}} per broker start), C{topology} (C{exchanges}
name -> type, C{queues} (consumed), C{parked}, C{queue_arguments},
C{bindings}), C{broker_command} and C{broker_stop_status} (backend runs),
C{ports} (C{amqp}: the port of each epoch) and C{clients} (per client name its
counters: C{published}, C{confirmed}, C{nacked_by_broker}, C{delivered},
C{acked}, C{nacked}, C{rejected}, C{sessions}, C{cpu_ms}: the client
process's CPU milliseconds from the moment it was ready to its end) and
C{cpu} (C{broker_seconds}: the broker's CPU seconds during the workload, every
incarnation counted, null when one died unseen; C{client_seconds}: the sum of
the clients' C{cpu_ms}; C{wall_seconds}: the workload's span).

An export line (``python -m spark_jobs.export``) has C{backend}, C{vhost},
C{queue}, C{exchange}, C{message_id} (empty when the message has none),
C{body_sha256}, C{size}, C{priority} (0 when none) and C{state} (``ready``: in
the queue, delivered or not, C{exchange} being the one it was published or
dead-lettered through; ``delayed``: waiting in the delayed index, with
C{queue} ``""`` and C{exchange} the delayed exchange it waits for). A message
held by several queues has one line per queue; ready lines come queue by
queue (sorted by vhost and name), each queue's in its order, then the delayed
ones in due order.
"""

RUN_FILE = "run.json"
BACKEND_RUN, REFERENCE_RUN = "backend", "reference"
CLUSTER_RUN = "cluster"  # three brokerd nodes of one cluster (spark_jobs.cluster_broker)
RUN_KINDS = (BACKEND_RUN, REFERENCE_RUN, CLUSTER_RUN)
EVENTS_DIRECTORY = "events"
EXPORT_FILE = "export.jsonl"
DATA_DIRECTORY = "data"
BROKER_LOG = "broker.log"

PUBLISH, CONFIRM, DELIVER, ACK, NACK, REJECT = (
    "publish", "confirm", "deliver", "ack", "nack", "reject")
SETTLE_KINDS = (ACK, NACK, REJECT)
EVENT_KINDS = (PUBLISH, CONFIRM, DELIVER, *SETTLE_KINDS)

READY, DELAYED = "ready", "delayed"
STORED_STATES = (READY, DELAYED)

# Every field an event line may carry, with its JSON type; a kind carries the
# common fields and the ones listed for it in the module docstring.
COMMON_FIELDS = {"kind": str, "backend": str, "client": str, "session": int, "epoch": int, "n": int,
                 "t": float}
EVENT_FIELDS = {
    **COMMON_FIELDS,
    "message_id": str,
    "publisher": int,
    "seq": int,
    "exchange": str,
    "routing_key": str,
    "queues": list,
    "size": int,
    "body_sha256": str,
    "priority": int,
    "confirm": bool,
    "ok": bool,
    "queue": str,
    "consumer": int,
    "delivery_tag": int,
    "redelivered": bool,
    "delivery_count": int,
    "requeue": bool,
}
# The fields each kind carries beyond the common ones, in the order the runner writes them.
KIND_FIELDS = {
    PUBLISH: ("message_id", "publisher", "seq", "exchange", "routing_key", "queues", "size",
              "body_sha256", "priority", "confirm"),
    CONFIRM: ("message_id", "publisher", "seq", "ok"),
    DELIVER: ("message_id", "queue", "consumer", "delivery_tag", "redelivered", "delivery_count",
              "size", "body_sha256"),
    ACK: ("message_id", "queue", "consumer", "requeue"),
    NACK: ("message_id", "queue", "consumer", "requeue"),
    REJECT: ("message_id", "queue", "consumer", "requeue"),
}
EXPORT_FIELDS = {
    "backend": str,
    "vhost": str,
    "queue": str,
    "exchange": str,
    "message_id": str,
    "body_sha256": str,
    "size": int,
    "priority": int,
    "state": str,
}


def message_id(publisher, seq):
    """The id of a publisher's C{seq}th message: sortable and the same on every backend."""
    return f"p{publisher}-{seq:09d}"


# The checks of a summary, in the order the report lists them: per backend
# (L{spark_jobs.checks}), then across backends (L{spark_jobs.cross_checks}).
BACKEND_CHECKS = (
    "confirmed_delivered_or_stored",
    "no_unflagged_duplicates",
    "order_per_publisher_and_priority",
    "acked_not_redelivered",
    "delivered_bodies_match",
    "stored_matches_published",
)
CROSS_BACKEND_CHECKS = ("same_messages", "same_bodies", "same_queue_sequences")
# What each check means, in a sentence the report shows beside its name; the
# full definitions are in the docstrings of spark_jobs.checks and
# spark_jobs.cross_checks.
CHECK_DESCRIPTIONS = {
    "confirmed_delivered_or_stored":
        "Every message confirmed with basic.ack was delivered from each queue it was routed to,"
        " or is still stored in it.",
    "no_unflagged_duplicates":
        "A message delivered again from a queue carried the redelivered flag.",
    "order_per_publisher_and_priority":
        "Each consumer connection got a publisher's messages of one priority from a queue in"
        " publish order (redeliveries aside).",
    "acked_not_redelivered":
        "Nothing acked came back in the same broker run (an ack lost to a crash is counted, not"
        " failed).",
    "delivered_bodies_match":
        "Every delivery has the body size and SHA-256 its message was published with.",
    "stored_matches_published":
        "Every stored message was published to that queue, with that body, is stored once, and"
        " was not acked before the final clean stop.",
    "same_messages":
        "Messages confirmed on every run were delivered or stored in the same queues on every"
        " run.",
    "same_bodies":
        "A message id has one body everywhere: in the publishes, deliveries and stores of every"
        " run.",
    "same_queue_sequences":
        "Each queue delivered a publisher's messages of one priority in the same order on every"
        " run.",
}


# The per-run checks that read the broker's stored state (the export): not
# applicable to a run without one (a reference broker's).
EXPORT_CHECKS = ("stored_matches_published",)


def check_applies(check):
    """Whether a summary's check entry counts toward the verdict: all but those marked
    C{"applicable": false}."""
    return check.get("applicable", True) is not False
