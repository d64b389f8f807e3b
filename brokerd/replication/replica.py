"""What a follower keeps in its own stores besides the leader's data, and how it reads them back.

A follower's store holds two things of replication's own, both through the
store contract, so that they are as durable as the data they describe, in
every backend, and need no file beside the store:

  - each message carries its replication id in its properties (the field
    C{replication_id}, which only a follower's stores hold: a flat field, so
    that storing a message costs little more than the leader's store did), so
    the follower's id-to-handle map is rebuilt at open from C{recover} and
    C{delayed_after}. An appended message's properties are the leader's bytes
    with that field's bytes after them (protobuf reads the two as one
    message), handed to the store serialised: nothing is parsed or encoded
    again per message;
  - a state record, an exchange record in a vhost no client can name
    (L{STATE_VHOST}), holds the cluster id, the leader's epoch and history,
    the last sequence number the store's commits cover and the store's role
    (L{StoreState}); it is written before every commit.

L{ReplicaReader} reads a follower's store as the leader's: without the state
record and with each message's properties as the leader stored them.
"""

from typing import NamedTuple

from twisted.internet import defer

from brokerd.interfaces import DelayedMessage, MessageRecord, SerializedPropertiesMessage
from brokerd.proto import messages_pb2
from brokerd.proto.tables import dict_to_table, table_to_dict
from brokerd.proto.wire_format import VARINT, field_key, varint
from brokerd.replication.codec import StreamError

# AMQP vhost names are short strings; one starting with NUL cannot come from a client.
STATE_VHOST = "\x00brokerd-replication"
STATE_NAME = "state"
FOREVER = 2 ** 63 - 1
DELAYED_WINDOW = 1000
REPLICATION_ID_KEY = field_key(
    messages_pb2.BasicProperties.DESCRIPTOR.fields_by_name["replication_id"].number, VARINT
)


def split_replication_id(record):
    """
    C{(replication id, record as the leader stored it)} of a record a
    follower's store gave back; C{(None, record)} for one stored otherwise.
    """
    if not record.properties.HasField("replication_id"):
        return None, record
    properties = messages_pb2.BasicProperties()
    properties.CopyFrom(record.properties)
    replication_id = properties.replication_id
    properties.ClearField("replication_id")
    return replication_id, MessageRecord(record.exchange, record.routing_key, properties,
                                         record.body, record.published_at)


# A store's role, as its state record says.
FOLLOWER = "follower"  # holds a leader's stream up to the state's sequence
PARTIAL = "partial"  # wiped for a snapshot that has not finished: resyncs
LEADER = "leader"  # written as a leader's since the state's sequence: resyncs
# Following a leader in a run that has not ended cleanly: its data may be ahead of the
# state's sequence (the record is written only now and then), so it resyncs.
RUNNING = "running"


class StoreState(NamedTuple):
    """
    What a store's state record says: the cluster its data belongs to, the
    epoch of the leader it last followed and that leader's history (C{((epoch,
    end sequence), ...)}, newest first), the last sequence its commits cover,
    and its role (L{FOLLOWER}, L{PARTIAL}, L{LEADER} or L{RUNNING}).
    """

    cluster: str = ""
    epoch: int = 0
    sequence: int = 0
    role: str = FOLLOWER
    history: tuple = ()


def state_record(state):
    """The exchange record that holds a store's L{StoreState}."""
    record = messages_pb2.ExchangeRecord(vhost=STATE_VHOST, name=STATE_NAME,
                                         type=messages_pb2.DIRECT, durable=True)
    history = ",".join(f"{epoch}:{end}" for epoch, end in state.history)
    dict_to_table({"cluster": state.cluster, "epoch": state.epoch, "sequence": state.sequence,
                   "role": state.role, "history": history}, record.arguments)
    return record


def read_state(record):
    """The L{StoreState} of a L{state_record}; a damaged one reads as not resumable."""
    values = table_to_dict(record.arguments)
    try:
        history = tuple(tuple(int(part) for part in entry.split(":"))
                        for entry in str(values.get("history", "")).split(",") if entry)
        if any(len(entry) != 2 for entry in history):
            raise ValueError(history)
        return StoreState(str(values.get("cluster", "")), int(values.get("epoch", 0)),
                          int(values.get("sequence", 0)), str(values.get("role", FOLLOWER)),
                          history)
    except (TypeError, ValueError):
        return StoreState(str(values.get("cluster", "")), role=PARTIAL)


def message(record, replication_id, body):
    """The L{MessageRecord} a follower stores for an append's or delay's operation record."""
    published_at = record.published_at if record.HasField("published_at") else None
    return MessageRecord(record.message_exchange, record.routing_key,
                         _properties(record.properties, replication_id), body, published_at)


def _properties(encoded, replication_id):
    """The leader's serialised properties, decoded, with C{replication_id} set in them."""
    try:
        properties = messages_pb2.BasicProperties.FromString(encoded)
    except Exception as problem:  # protobuf's DecodeError
        raise StreamError(f"undecodable properties of message {replication_id}:"
                          f" {problem}") from None
    properties.replication_id = replication_id
    return properties


class Append(NamedTuple):
    """
    What an append's operation record says, read once: a follower keeps one
    for each distinct record it receives (messages published alike share
    one) and makes each message's L{MessageRecord} from it.
    """

    store: str
    queues: tuple  # ((vhost, name), ...)
    exchange: str
    routing_key: str
    properties: bytes  # as the leader serialised them
    published_at: object  # int, or None

    @classmethod
    def of(cls, record, sequence):
        """
        The L{Append} of an append's record; raises L{StreamError} if it names no
        queue or its properties do not parse.
        """
        queues = tuple((key.vhost, key.name) for key in record.queues)
        if not queues:
            raise StreamError(f"append at sequence {sequence} names no queue")
        _properties(record.properties, sequence)  # refused here, not when read back
        published_at = record.published_at if record.HasField("published_at") else None
        return cls(record.store, queues, record.message_exchange, record.routing_key,
                   record.properties, published_at)

    def message(self, replication_id, body):
        """The message a follower stores for this append with C{replication_id}."""
        return SerializedPropertiesMessage(
            self.exchange, self.routing_key,
            self.properties + REPLICATION_ID_KEY + varint(replication_id), body,
            self.published_at)


def binding_key(record):
    """What tells one binding from another: the record itself, serialised the same way."""
    return record.SerializeToString(deterministic=True)


def is_state(item):
    return isinstance(item, messages_pb2.ExchangeRecord) and item.vhost == STATE_VHOST


class ReplicaReader:
    """
    Reads an opened follower store as the leader's store would read: its
    topology without the state record, its messages without their ids. A
    follower that takes over opens its stores through this view.
    """

    def __init__(self, store):
        self._store = store

    def topology(self):
        return [item for item in self._store.topology() if not is_state(item)]

    def recover(self, queue):
        """C{(handle, record, redelivered, replication id)} of C{queue}, in queue order."""
        found = []
        for handle, record, redelivered in self._store.recover(queue):
            replication_id, record = split_replication_id(record)
            found.append((handle, record, redelivered, replication_id))
        return found

    def delivery_counts(self, queue):
        return self._store.delivery_counts(queue)

    @defer.inlineCallbacks
    def delayed(self):
        """
        A Deferred firing with every kept delayed message, as
        C{(DelayedMessage, replication id)}, the message's id taken off.
        """
        found, cursor = [], None
        while True:
            window = yield self._store.delayed_after(cursor, FOREVER, DELAYED_WINDOW)
            for item in window:
                replication_id, record = split_replication_id(item.record)
                found.append((DelayedMessage(item.due, item.handle, item.exchange, record),
                              replication_id))
            if len(window) < DELAYED_WINDOW:
                return found
            cursor = (window[-1].due, window[-1].handle)
