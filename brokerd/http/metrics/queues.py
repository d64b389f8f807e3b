"""What the queues hold: RabbitMQ's C{queue_*} families, one sample per queue
(labels C{vhost} and C{queue}), narrowed to some vhosts by C{/metrics/detailed}'s
C{vhost=}.

Un-acked messages are the channels' deliveries not yet settled, read entry by
entry for their bytes: a scrape costs O(queues + un-acked deliveries). Body bytes
are those held in memory: a ready message paged out to the store counts as a
message but not in bytes (brokerd keeps only its handle).
"""

from brokerd.http.metrics.families import COUNTER, GAUGE, Family


def unacked_by_queue(broker):
    """C{(vhost, queue)} -> C{[un-acked deliveries, their body bytes]}."""
    unacked = {}
    for connection in broker.connections:
        for channel in connection.channels.values():
            for entry in channel.unacked_deliveries.values():
                held = unacked.get(entry.queue.key)
                if held is None:
                    held = unacked[entry.queue.key] = [0, 0]
                held[0] += 1
                message = entry.message
                if message is not None:
                    held[1] += len(message.body)
    return unacked


def _queues(broker, vhosts):
    for vhost in list(broker.vhosts.values()):
        if vhosts is None or vhost.name in vhosts:
            for queue in vhost.queues.values():
                yield vhost, queue


def _coarse(broker, vhosts):
    unacked = unacked_by_queue(broker)
    for vhost, queue in _queues(broker, vhosts):
        held = unacked.get(queue.key, (0, 0))[0]
        ready = queue.message_count
        yield (vhost.name, queue.name), (ready, held, ready + held)


def _figures(broker, vhosts):
    unacked = unacked_by_queue(broker)
    for vhost, queue in _queues(broker, vhosts):
        held_bytes = unacked.get(queue.key, (0, 0))[1]
        ready_bytes = queue.ready_bytes
        yield (vhost.name, queue.name), (
            queue.consumer_count, ready_bytes, held_bytes, ready_bytes + held_bytes,
        )


QUEUE_LABELS = ("vhost", "queue")

QUEUE_COARSE = Family("queue_coarse_metrics", (
    ("queue_messages_ready", GAUGE, "Messages ready to be delivered to consumers"),
    ("queue_messages_unacked", GAUGE, "Messages delivered to consumers but not yet acknowledged"),
    ("queue_messages", GAUGE, "Sum of ready and unacknowledged messages - total queue depth"),
), QUEUE_LABELS, _coarse, vhost_filtered=True)

QUEUE_CONSUMER_COUNT = Family("queue_consumer_count", (
    ("queue_consumers", GAUGE, "Consumers on a queue"),
), QUEUE_LABELS, lambda broker, vhosts: [
    ((vhost.name, queue.name), (queue.consumer_count,)) for vhost, queue in _queues(broker, vhosts)
], vhost_filtered=True)

QUEUE = Family("queue_metrics", (
    ("queue_consumers", GAUGE, "Consumers on a queue"),
    ("queue_messages_ready_bytes", GAUGE, "Size in bytes of ready messages"),
    ("queue_messages_unacked_bytes", GAUGE, "Size in bytes of all unacknowledged messages"),
    ("queue_messages_bytes", GAUGE, "Size in bytes of ready and unacknowledged messages"),
), QUEUE_LABELS, _figures, vhost_filtered=True)

QUEUE_PUBLISHED = Family("channel_queue_exchange_metrics", (
    ("queue_messages_published", COUNTER, "Total number of messages published to queues"),
), QUEUE_LABELS, lambda broker, vhosts: [
    ((vhost.name, queue.name), (queue.messages_published,))
    for vhost, queue in _queues(broker, vhosts)
], vhost_filtered=True)
