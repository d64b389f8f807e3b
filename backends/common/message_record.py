"""The L{MessageRecord} every store hands back, made from what a backend holds.

On disk the backends keep a message as a protobuf C{StoredMessage} (with or
without its body); that encoding stays inside them. Whatever a store gives
back from C{read}, C{recover}, C{load} or C{delayed_after} is a
L{brokerd.interfaces.MessageRecord}, built here once per message.
"""

from twisted.logger import Logger

from brokerd.interfaces import MessageRecord, UnreadableMessage
from brokerd.proto import messages_pb2

log = Logger()


def record_of(message):
    """The record of C{message} if it is one, else of an object with a record's
    attributes (a message appended)."""
    if type(message) is MessageRecord:
        return message
    return MessageRecord(message.exchange, message.routing_key, message.properties,
                         bytes(message.body), message.published_at)


def record_of_stored(stored, body=None):
    """
    The record of a parsed StoredMessage: of a whole one, or of a body-less
    head whose C{body} is kept apart. The properties are copied out: a parsed
    message's own properties keep all of it alive (a body it holds too), at
    over twice the memory of a copy, for as long as the record is held.
    """
    properties = messages_pb2.BasicProperties()
    properties.CopyFrom(stored.properties)
    published_at = stored.published_at if stored.HasField("published_at") else None
    return MessageRecord(stored.exchange, stored.routing_key, properties,
                         stored.body if body is None else body, published_at)


def loaded_records(load, queue, handles, kept, skip_missing=False):
    """
    A paging store's C{recover(queue)}: C{(handle, record, True)} of each of
    C{handles} that C{load} reads, one at a time as it is iterated. One
    whose record does not parse is quarantined: logged, saying where it is
    C{kept}, and left out; with C{skip_missing}, so is one C{load} no longer
    finds (KeyError: acked since open, for a store whose handles open listed).
    """
    for handle in handles:
        try:
            message = load(handle)
        except KeyError:
            if not skip_missing:
                raise
            continue
        except UnreadableMessage as problem:
            log.error("queue {queue!r} in vhost {vhost!r}: quarantined stored message {handle},"
                      " not delivered: {problem}; {kept}",
                      queue=queue[1], vhost=queue[0], handle=handle, problem=problem, kept=kept)
            continue
        yield handle, record_of(message), True
