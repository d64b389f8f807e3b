"""After a crash: drain what the restarted broker kept, and check it against what the crash client logged.

Everything confirmed and never acked must come back, nothing durably acked may,
and what comes back must be intact, unique and in each publisher's order.
"""

from pamqp import commands

from brokerd.loadgen.amqp_client import Connection, Loop
from brokerd.loadgen.amqp_codec import BenchmarkError
from crashloop.body import (
    MARKER_PUBLISHER,
    CorruptBody,
    check_properties,
    format_id,
    make_body,
    parse_body,
)

QUEUE = "crash-test"  # the durable queue the crash client publishes to and consumes from
MARKERS = QUEUE + ".markers"  # where its consumer publishes the markers that prove its acks durable


def drain(host, port, queue=QUEUE, markers=MARKERS):
    """
    Consume and ack every message of C{queue}; empty C{markers}; then make those
    acks durable with a confirmed marker publish on the same channel.

    @return: a list of C{(redelivered, properties, body)} in delivery order.
    """
    loop = Loop()
    connection = Connection(loop, host, port, "crash-drain")
    try:
        connection.open()
        declared = connection.rpc(commands.Queue.Declare(queue=queue, durable=True), commands.Queue.DeclareOk)
        connection.rpc(commands.Queue.Declare(queue=markers, durable=True), commands.Queue.DeclareOk)
        expected = declared.message_count
        deliveries = []
        state = {"acked_through": 0, "last_tag": 0, "confirmed": False}

        def delivered(delivery):
            deliveries.append((delivery.redelivered, delivery.properties, delivery.body))
            state["last_tag"] = delivery.delivery_tag

        def after_read():
            if state["last_tag"] - state["acked_through"] >= 500 or (
                len(deliveries) >= expected and state["last_tag"] > state["acked_through"]
            ):
                connection.ack(state["last_tag"], multiple=True)
                state["acked_through"] = state["last_tag"]

        def confirmed(channel, delivery_tag, multiple, ack):
            if not ack:
                raise BenchmarkError("the broker nacked the drain's marker")
            state["confirmed"] = True

        connection.on_delivery = delivered
        connection.after_read = after_read
        connection.on_confirm = confirmed
        if expected:
            connection.rpc(commands.Basic.Qos(prefetch_count=2000), commands.Basic.QosOk)
            consumer = connection.rpc(commands.Basic.Consume(queue=queue), commands.Basic.ConsumeOk)
            loop.run_until(
                lambda: len(deliveries) >= expected and state["acked_through"] == state["last_tag"],
                lambda: f"draining {queue}: {len(deliveries)} of {expected} delivered",
                lambda: len(deliveries),
            )
            connection.rpc(commands.Basic.Cancel(consumer_tag=consumer.consumer_tag), commands.Basic.CancelOk)
        left = connection.rpc(commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk)
        if left.message_count:
            raise BenchmarkError(f"{left.message_count} messages still in {queue} after draining {expected}")
        connection.rpc(commands.Queue.Purge(queue=markers), commands.Queue.PurgeOk)
        connection.rpc(commands.Confirm.Select(), commands.Confirm.SelectOk)
        connection.publish(markers, make_body(0, MARKER_PUBLISHER, 0, b"drained"))
        loop.run_until(lambda: state["confirmed"], lambda: "waiting for the drain marker's confirm")
        connection.close()
    finally:
        connection.shut()
    return deliveries


def check_recovery(deliveries, run, confirmed, sent, durably_acked, acks_sent):
    """
    What is wrong with the messages a restarted broker delivered after the
    crash of cycle C{run} (every earlier cycle's messages were drained).

    @param deliveries: C{(redelivered, properties, body)} in queue order.
    @param confirmed: {publisher: [(first, last)]} ranges confirmed in C{run}.
    @param sent: {publisher: number of messages published in C{run}}.
    @param durably_acked: ids whose ack a confirmed marker proved durable.
    @param acks_sent: ids the consumer acked (durable or not).
    @return: a list of problems, empty if all is well; and the ids delivered.
    """
    problems = []
    seen = set()
    last_sequence = {}
    for position, (_redelivered, properties, body) in enumerate(deliveries):
        try:
            message_id = parse_body(body)
        except CorruptBody as corrupt:
            problems.append(f"delivery {position}: corrupt body: {corrupt}")
            continue
        text = format_id(message_id)
        wrong = check_properties(properties)
        if wrong:
            problems.append(f"message {text}: {wrong}")
        if message_id in seen:
            problems.append(f"message {text} delivered twice")
        seen.add(message_id)
        if message_id in durably_acked:
            problems.append(f"message {text} came back although its ack was durable")
        message_run, publisher, sequence = message_id
        if message_run < run:
            problems.append(f"message {text} came back although it was drained (acked durably) before")
        elif message_run > run or sequence > sent.get(publisher, 0):
            problems.append(f"message {text} was never published")
        previous = last_sequence.get((message_run, publisher))
        if previous is not None and sequence <= previous:
            problems.append(f"message {text} came back after {message_run}:{publisher}:{previous}:"
                            " out of publish order")
        last_sequence[(message_run, publisher)] = sequence
    missing = []
    for publisher, ranges in sorted(confirmed.items()):
        for first, last in ranges:
            for sequence in range(first, last + 1):
                message_id = (run, publisher, sequence)
                if message_id not in seen and message_id not in acks_sent:
                    missing.append(message_id)
    if missing:
        shown = ", ".join(map(format_id, missing[:10]))
        problems.append(f"{len(missing)} confirmed, never acked messages did not come back: {shown}"
                        + (" ..." if len(missing) > 10 else ""))
    return problems, seen
