"""The durable topology of a file-based store and the small file that keeps it.

The whole topology is rewritten on every change and replaced atomically
(write a temporary file, fsync it, rename it over the old one, fsync the
directory): topology changes are rare and the file is small, and a reader then
only ever sees a complete topology. The file is a magic line naming the backend
and the format version, then one entry per record (``[u8 kind][u32 length]
[record bytes]``), then a CRC of all before it.

An entry whose framing and CRC hold but whose record cannot be read back (it
does not parse, or its binding arguments hold values brokerd cannot take) is
quarantined: L{Topology.records} hands out a L{QuarantinedRecord} in its
place, and the entry is written back unchanged with every later topology,
until the exchange or queue it names is saved again or deleted.
"""

import struct
import zlib

from backends.common.quarantine import parse_or_none, quarantined_topology
from brokerd.interfaces import StoreCorrupted
from brokerd.proto import messages_pb2
from brokerd.proto.tables import freeze, table_to_dict

TOPOLOGY_FILE = "topology"
FILELOG_MAGIC = b"brokerd filelog topology 1\n"
ENTRY = struct.Struct(">BI")
CRC = struct.Struct(">I")
RECORD_KINDS = {1: messages_pb2.ExchangeRecord, 2: messages_pb2.QueueRecord,
                3: messages_pb2.BindingRecord}
KIND_OF = {record_type: kind for kind, record_type in RECORD_KINDS.items()}


class KeptEntry:
    """
    A topology file entry that cannot be read back, kept as its bytes.

    @ivar kind: its entry kind (a key of L{RECORD_KINDS}).
    @ivar data: its record bytes.
    @ivar quarantined: its L{QuarantinedRecord}.
    """

    __slots__ = ("kind", "data", "quarantined")

    def __init__(self, kind, data, quarantined):
        self.kind, self.data, self.quarantined = kind, data, quarantined

    def names(self, kind_name, vhost, name):
        """Whether this entry is the C{kind_name} (C{"exchange"}, C{"queue"}) C{name} of
        C{vhost}."""
        quarantined = self.quarantined
        return (quarantined.kind == kind_name and quarantined.vhost == vhost
                and quarantined.name == name)

    def binds(self, vhost, exchange=None, queue=None):
        """Whether this entry is a binding of C{vhost} from or to C{exchange}, or to C{queue}."""
        quarantined = self.quarantined
        if quarantined.kind != "binding" or quarantined.vhost != vhost or quarantined.name is None:
            return False
        name = quarantined.name  # (source, queue, key) or (source, "", key, destination exchange)
        return name[0] == exchange or name[3:] == (exchange,) or name[1] == queue


def binding_key(record):
    """What makes two bindings the same binding."""
    return (record.vhost, record.exchange, record.queue, record.routing_key,
            freeze(table_to_dict(record.arguments)), record.destination_exchange)


class Topology:
    """Durable exchanges, queues and bindings, each kept in the order first saved."""

    def __init__(self, records=()):
        self.exchanges = {}  # (vhost, name) -> ExchangeRecord
        self.queues = {}  # queue key -> QueueRecord
        self.bindings = {}  # binding key -> BindingRecord
        self.kept = []  # KeptEntry of every record that cannot be read back, in file order
        for record in records:
            if isinstance(record, KeptEntry):
                self.kept.append(record)
            elif isinstance(record, messages_pb2.ExchangeRecord):
                self.save_exchange(record)
            elif isinstance(record, messages_pb2.QueueRecord):
                self.save_queue(record)
            else:
                try:
                    self.save_binding(record)
                except Exception as problem:
                    # Arguments whose values cannot be read (table_to_dict).
                    data = record.SerializeToString()
                    quarantined = quarantined_topology(
                        type(record), data, "in the topology file",
                        f"its arguments cannot be read ({problem})")
                    self.kept.append(KeptEntry(KIND_OF[type(record)], data, quarantined))

    def records(self):
        """
        Every record, exchanges and queues before the bindings that refer to
        them, with a L{QuarantinedRecord} in place of each that cannot be read.
        """
        kept = [entry.quarantined for entry in self.kept]
        return [*self.exchanges.values(), *self.queues.values(), *kept, *self.bindings.values()]

    def _drop_kept(self, matches):
        if self.kept:
            self.kept = [entry for entry in self.kept if not matches(entry)]

    def save_exchange(self, record):
        self.exchanges[(record.vhost, record.name)] = record
        self._drop_kept(lambda entry: entry.names("exchange", record.vhost, record.name))

    def delete_exchange(self, vhost, name):
        self.exchanges.pop((vhost, name), None)
        for key in [key for key in self.bindings if key[0] == vhost and name in (key[1], key[5])]:
            del self.bindings[key]
        self._drop_kept(lambda entry: (entry.names("exchange", vhost, name)
                                       or entry.binds(vhost, exchange=name)))

    def save_queue(self, record):
        self.queues[(record.vhost, record.name)] = record
        self._drop_kept(lambda entry: entry.names("queue", record.vhost, record.name))

    def delete_queue(self, queue):
        self.queues.pop(queue, None)
        vhost, name = queue
        for key in [key for key in self.bindings if key[0] == vhost and key[2] == name]:
            del self.bindings[key]
        self._drop_kept(lambda entry: (entry.names("queue", vhost, name)
                                       or entry.binds(vhost, queue=name)))

    def save_binding(self, record):
        self.bindings[binding_key(record)] = record

    def delete_binding(self, record):
        self.bindings.pop(binding_key(record), None)

    def encode(self, magic=FILELOG_MAGIC):
        """The topology file's contents, starting with C{magic}."""
        parts = [magic]
        for record in [*self.exchanges.values(), *self.queues.values(), *self.bindings.values()]:
            data = record.SerializeToString()
            parts += (ENTRY.pack(KIND_OF[type(record)], len(data)), data)
        for entry in self.kept:
            parts += (ENTRY.pack(entry.kind, len(entry.data)), entry.data)
        body = b"".join(parts)
        return body + CRC.pack(zlib.crc32(body))


class DurableTopology:
    """
    A file-based store's durable topology: kept in memory, and the whole of
    it encoded for the topology file with the next commit after a change.

    @ivar magic: the first line of the store's topology file.
    """

    def __init__(self, magic=FILELOG_MAGIC):
        self.magic = magic
        self._topology = Topology()
        self._changed = False

    def recovered(self, records):
        """Take the records the store's open read from its topology file (as
        L{decode_topology} gives them)."""
        self._topology = Topology(records)

    def records(self):
        """See L{Topology.records}."""
        return self._topology.records()

    def save_exchange(self, record):
        self._topology.save_exchange(record)
        self._changed = True

    def delete_exchange(self, vhost, name):
        self._topology.delete_exchange(vhost, name)
        self._changed = True

    def save_queue(self, record):
        self._topology.save_queue(record)
        self._changed = True

    def delete_queue(self, queue):
        self._topology.delete_queue(queue)
        self._changed = True

    def save_binding(self, record):
        self._topology.save_binding(record)
        self._changed = True

    def delete_binding(self, record):
        self._topology.delete_binding(record)
        self._changed = True

    def take_changes(self):
        """The topology file's new contents if the topology changed since the last call, else
        None."""
        if not self._changed:
            return None
        self._changed = False
        return self._topology.encode(self.magic)

    def figures(self):
        """The numbers of queues, exchanges and bindings, for the store's stats()."""
        topology = self._topology
        return {"queues": len(topology.queues), "exchanges": len(topology.exchanges),
                "bindings": len(topology.bindings)}


def decode_topology(data, path, magic=FILELOG_MAGIC):
    """
    The records of a topology file's contents.

    An entry that is whole but whose record does not parse comes back as a
    L{KeptEntry} (the broker logs it when it recovers the topology).

    @raise StoreCorrupted: naming C{path}, if the contents are not a whole,
        undamaged topology file.
    """

    def damaged(reason, offset=None):
        return StoreCorrupted(f"topology file {path} is damaged: {reason};"
                              " the store cannot start without it", path, offset)

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
        data = body[start:end]
        record = parse_or_none(RECORD_KINDS[kind], data)
        if record is None:
            record = KeptEntry(kind, data, quarantined_topology(
                RECORD_KINDS[kind], data, f"topology file {path}, entry at offset {offset}"))
        records.append(record)
        offset = end
    return records


def kept_queue_names(records):
    """
    The keys of the queues whose records in C{records} (as L{decode_topology}
    gives them) cannot be read, and whether some such queue has no readable name.
    """
    keys, unnamed = set(), False
    for record in records:
        if isinstance(record, KeptEntry) and record.quarantined.kind == "queue":
            quarantined = record.quarantined
            if quarantined.name is None or quarantined.vhost is None:
                unnamed = True
            else:
                keys.add((quarantined.vhost, quarantined.name))
    return keys, unnamed


def read_topology(path, magic=FILELOG_MAGIC):
    """The records of the topology file at C{path}; none if there is no file yet (a new store)."""
    try:
        with open(path, "rb") as topology_file:
            data = topology_file.read()
    except FileNotFoundError:
        return []
    return decode_topology(data, path, magic)
