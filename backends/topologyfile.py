"""The durable topology of a file-based store and the small file that keeps it.

The whole topology is rewritten on every change and replaced atomically
(write a temporary file, fsync it, rename it over the old one, fsync the
directory): topology changes are rare and the file is small, and a reader then
only ever sees a complete topology. The file is a magic line naming the backend
and the format version, then one entry per record (``[u8 kind][u32 length]
[record bytes]``), then a CRC of all before it.
"""

import struct
import zlib

from google.protobuf.message import DecodeError

from brokerd.interfaces import StoreCorrupted
from brokerd.proto import messages_pb2
from brokerd.proto.tables import freeze, table_to_dict

TOPOLOGY_FILE = "topology"
FILELOG_MAGIC = b"brokerd filelog topology 1\n"
ENTRY = struct.Struct(">BI")
CRC = struct.Struct(">I")
RECORD_KINDS = {1: messages_pb2.ExchangeRecord, 2: messages_pb2.QueueRecord, 3: messages_pb2.BindingRecord}
KIND_OF = {record_type: kind for kind, record_type in RECORD_KINDS.items()}


def binding_key(record):
    """What makes two bindings the same binding."""
    return (record.vhost, record.exchange, record.queue, record.routing_key, freeze(table_to_dict(record.arguments)))


class Topology:
    """Durable exchanges, queues and bindings, each kept in the order first saved."""

    def __init__(self, records=()):
        self.exchanges = {}  # (vhost, name) -> ExchangeRecord
        self.queues = {}  # queue key -> QueueRecord
        self.bindings = {}  # binding key -> BindingRecord
        for record in records:
            if isinstance(record, messages_pb2.ExchangeRecord):
                self.save_exchange(record)
            elif isinstance(record, messages_pb2.QueueRecord):
                self.save_queue(record)
            else:
                self.save_binding(record)

    def records(self):
        """Every record, exchanges and queues before the bindings that refer to them."""
        return [*self.exchanges.values(), *self.queues.values(), *self.bindings.values()]

    def save_exchange(self, record):
        self.exchanges[(record.vhost, record.name)] = record

    def delete_exchange(self, vhost, name):
        self.exchanges.pop((vhost, name), None)
        for key in [key for key in self.bindings if key[0] == vhost and key[1] == name]:
            del self.bindings[key]

    def save_queue(self, record):
        self.queues[(record.vhost, record.name)] = record

    def delete_queue(self, queue):
        self.queues.pop(queue, None)
        vhost, name = queue
        for key in [key for key in self.bindings if key[0] == vhost and key[2] == name]:
            del self.bindings[key]

    def save_binding(self, record):
        self.bindings[binding_key(record)] = record

    def delete_binding(self, record):
        self.bindings.pop(binding_key(record), None)

    def encode(self, magic=FILELOG_MAGIC):
        """The topology file's contents, starting with C{magic}."""
        parts = [magic]
        for record in self.records():
            data = record.SerializeToString()
            parts += (ENTRY.pack(KIND_OF[type(record)], len(data)), data)
        body = b"".join(parts)
        return body + CRC.pack(zlib.crc32(body))


def decode_topology(data, path, magic=FILELOG_MAGIC):
    """
    The records of a topology file's contents.

    @raise StoreCorrupted: naming C{path}, if the contents are not a whole,
        undamaged topology file.
    """

    def damaged(reason, offset=None):
        return StoreCorrupted(f"topology file {path} is damaged: {reason}; the store cannot start without it", path, offset)

    if not data.startswith(magic):
        raise damaged(f"it does not start with the topology header {magic!r}", 0)
    if len(data) < len(magic) + CRC.size:
        raise damaged(f"it is cut short at {len(data)} bytes", len(data))
    body, (stored_crc,) = data[: -CRC.size], CRC.unpack_from(data, len(data) - CRC.size)
    if zlib.crc32(body) != stored_crc:
        raise damaged("its CRC does not match")
    records, offset = [], len(magic)
    while offset < len(body):
        if len(body) - offset < ENTRY.size:
            raise damaged("an entry header is cut short", offset)
        kind, length = ENTRY.unpack_from(body, offset)
        start, end = offset + ENTRY.size, offset + ENTRY.size + length
        if kind not in RECORD_KINDS or end > len(body):
            raise damaged(f"the entry at offset {offset} is not a topology record", offset)
        record = RECORD_KINDS[kind]()
        try:
            record.ParseFromString(body[start:end])
        except DecodeError:
            raise damaged(f"the record at offset {offset} does not decode", offset) from None
        records.append(record)
        offset = end
    return records


def read_topology(path, magic=FILELOG_MAGIC):
    """The records of the topology file at C{path}; none if there is no file yet (a new store)."""
    try:
        with open(path, "rb") as topology_file:
            data = topology_file.read()
    except FileNotFoundError:
        return []
    return decode_topology(data, path, magic)
