"""Records a store holds intact but cannot read back, and what the stores do with them.

A record whose checksum holds can still fail to parse: protobuf refuses to
parse messages nested past its recursion limit (100), which a field table
some 33 levels deep reaches. Such a record is quarantined, never fatal: the
store names it (what it is, and where) and goes on with everything else.

The name of a topology record is read from its top-level fields without
parsing the rest, as the nesting is always inside the arguments table.
"""

import os

from google.protobuf.message import DecodeError

from backends.common.fileio import TEMPORARY_SUFFIX, fsync_directory
from brokerd.interfaces import QuarantinedRecord, StoreCorrupted, UnreadableMessage
from brokerd.proto import messages_pb2

QUARANTINE_DIRECTORY = "quarantine"
RECORD_SUFFIX = ".record"

KIND_NAMES = {
    messages_pb2.ExchangeRecord: "exchange",
    messages_pb2.QueueRecord: "queue",
    messages_pb2.BindingRecord: "binding",
}
_NAME_FIELDS = {  # record type -> (vhost field, name fields): the field numbers of messages.proto
    messages_pb2.ExchangeRecord: (1, (2,)),
    messages_pb2.QueueRecord: (1, (2,)),
    messages_pb2.BindingRecord: (1, (2, 3, 4)),
}
DESTINATION_EXCHANGE_FIELD = 6  # BindingRecord.destination_exchange


def parse_or_none(record_type, data):
    """The record of C{record_type} C{data} holds, or None if protobuf cannot parse it."""
    record = record_type()
    try:
        record.ParseFromString(data)
    except DecodeError:
        return None
    return record


def read_varint(data, offset, end):
    """The protobuf varint at C{data[offset]} and where it ends;
    ValueError if it runs past C{end} or 10 bytes."""
    value = shift = 0
    while offset < end and shift <= 63:
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, offset
        shift += 7
    raise ValueError("a varint that runs past its bytes or 10 bytes")


def top_level_strings(data, numbers):
    """
    The values of the length-delimited fields C{numbers} at the top level of
    the protobuf message C{data}, as text (the last one of each number wins);
    nested messages are stepped over, not parsed. Fields that cannot be
    found are left out.
    """
    found, offset, data = {}, 0, memoryview(data)
    try:
        while offset < len(data):
            key, offset = read_varint(data, offset, len(data))
            number, wire_type = key >> 3, key & 7
            if wire_type == 0:
                _, offset = read_varint(data, offset, len(data))
            elif wire_type == 1:
                offset += 8
            elif wire_type == 5:
                offset += 4
            elif wire_type == 2:
                length, offset = read_varint(data, offset, len(data))
                if number in numbers and offset + length <= len(data):
                    found[number] = bytes(data[offset : offset + length]).decode("utf-8", "replace")
                offset += length
            else:
                break  # groups are not used by brokerd's records: what follows cannot be walked
    except (IndexError, ValueError):
        pass
    return found


def quarantined_topology(record_type, data, where,
                         reason="it does not parse (nested deeper than protobuf reads)"):
    """The L{QuarantinedRecord} of the topology record C{data} of C{record_type} that did not
    parse."""
    vhost_field, name_fields = _NAME_FIELDS[record_type]
    fields = top_level_strings(data, {vhost_field, *name_fields, DESTINATION_EXCHANGE_FIELD})
    destination_exchange = None
    if record_type is messages_pb2.BindingRecord and fields.get(DESTINATION_EXCHANGE_FIELD):
        # A binding to an exchange: (source, "", routing key, destination exchange); protobuf
        # leaves its empty queue (and an empty routing key) out.
        destination_exchange = fields[DESTINATION_EXCHANGE_FIELD]
        fields.setdefault(3, "")
        fields.setdefault(4, "")
    names = [fields.get(number) for number in name_fields]
    if any(name is None for name in names):
        name = None
    elif destination_exchange is not None:
        name = (*names, destination_exchange)
    else:
        name = names[0] if len(names) == 1 else tuple(names)
    return QuarantinedRecord(KIND_NAMES[record_type], fields.get(vhost_field), name, where, reason)


def unreadable_message(where, problem):
    """The L{UnreadableMessage} for a stored message at C{where} whose intact record does not
    parse."""
    return UnreadableMessage(f"the stored message at {where} does not parse ({problem})")


def parse_stored_message(record, where, what, path):
    """
    The StoredMessage of an intact C{record}: L{UnreadableMessage} naming
    C{where} if protobuf refuses it (quarantined), L{StoreCorrupted} naming
    C{what} and C{path} if parsing fails any other way.
    """
    try:
        return messages_pb2.StoredMessage.FromString(record)
    except DecodeError as error:
        raise unreadable_message(where, error) from None
    except Exception as error:
        raise StoreCorrupted(f"{what} cannot be read as a StoredMessage ({error})",
                             path=path) from None


def keep_aside(directory, name, parts):
    """
    Write a copy of a quarantined record (C{parts}, bytes joined) to
    C{<directory>/quarantine/<name>.record}, durably (temporary file, fsync,
    rename, directory fsync): the store lets go of the original afterwards.

    @return: the path of the copy.
    """
    folder = os.path.join(directory, QUARANTINE_DIRECTORY)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name + RECORD_SUFFIX)
    temporary = path + TEMPORARY_SUFFIX
    with open(temporary, "wb") as copy:
        for part in parts:
            copy.write(part)
        copy.flush()
        os.fsync(copy.fileno())
    os.replace(temporary, path)
    fsync_directory(folder)
    return path
