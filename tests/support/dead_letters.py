"""Queues with a dead-letter exchange, and draining what was dead-lettered, for the queue-limit and
policy tests."""



def drain(channel, queue):
    bodies = []
    while (result := channel.basic_get(queue, no_ack=True)) is not None:
        bodies.append(result[2].body)
    return bodies


def outcomes(peer):
    """The publisher confirms as {sequence: True (ack) / False (nack)}, multiple acks expanded."""
    decided, last = {}, 0
    for sequence, multiple, ack in peer.confirms:
        first = last + 1 if multiple else sequence
        for number in range(first, sequence + 1):
            decided[number] = ack
        last = max(last, sequence)
    return decided


def with_dead_letters(channel, queue="q", **arguments):
    """C{queue} dead-lettering to fanout "dlx", which feeds queue "dead"."""
    channel.exchange_declare("dlx", "fanout")
    channel.queue_declare("dead")
    channel.queue_bind("dead", "dlx")
    channel.queue_declare(queue, arguments={"x-dead-letter-exchange": "dlx", **arguments})


def dead(channel):
    """(body, x-death reason) of each dead-lettered message, taken from "dead"."""
    got = []
    while (result := channel.basic_get("dead", no_ack=True)) is not None:
        got.append((result[2].body, result[2].headers["x-death"][0]["reason"]))
    return got
