"""The operation records a leader's tap streams for one store, built with what messages
published alike share encoded once."""

from brokerd.proto import replication_pb2


def queue_key(queue):
    """The replication record of a queue key C{(vhost, name)}."""
    return replication_pb2.QueueKey(vhost=queue[0], name=queue[1])


class OperationEncoder:
    """
    Builds the C{ReplicatedOperation}s of one store (the vhost named C{store_name}, or C{""}
    for the shared store). Messages published alike share one properties object: their
    properties are encoded once, and a run of appends that differ in nothing but the body
    share one encoded record.
    """

    def __init__(self, store_name):
        self._store_name = store_name
        self._properties = (None, None)  # the last properties encoded, and their bytes
        # The last append encoded: its properties, routing key, exchange, publish time,
        # queues and bytes.
        self._last_append = (None, None, None, None, None, b"")

    def operation(self, **fields):
        return replication_pb2.ReplicatedOperation(store=self._store_name, **fields)

    def message(self, message, **fields):
        """The operation of an append or delay of C{message}, with C{fields} added."""
        operation = self.operation(
            message_exchange=message.exchange, routing_key=message.routing_key,
            properties=self._encoded_properties(message.properties), **fields)
        if message.published_at is not None:
            operation.published_at = int(message.published_at)
        return operation

    def append(self, message, queues):
        """
        The encoded operation of an append of C{message} to C{queues}: the same bytes object
        for appends alike (one properties object, exchange, routing key, publish time and
        queues), which the stream takes for a run of them.
        """
        last = self._last_append
        if (message.properties is last[0] and message.routing_key == last[1]
                and message.exchange == last[2] and message.published_at == last[3]
                and queues == last[4]):
            return last[5]
        encoded = self.message(message, queues=[queue_key(queue) for queue in queues])
        encoded = encoded.SerializeToString()
        self._last_append = (message.properties, message.routing_key, message.exchange,
                             message.published_at, list(queues), encoded)
        return encoded

    def _encoded_properties(self, properties):
        last, encoded = self._properties
        if last is not properties:
            encoded = properties.SerializeToString()
            self._properties = (properties, encoded)
        return encoded
