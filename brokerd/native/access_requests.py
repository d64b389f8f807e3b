"""The native protocol's management requests: ManagementRequest in, ManagementReply out.

A request on an open channel is handed, with the name of the user who logged
in on the connection, to the broker's L{brokerd.access.interfaces.IAccessCommands}, which
checks and carries it out; this module only translates. The answer goes out
once the change is durable, as a table in parts of at most
L{REPLY_PART_BYTES} of rows each (one row larger than that goes alone), so
that no reply frame grows with the number of users; a refusal closes the
channel (or, for an error of the connection's, the connection) with the
error's reply code and text, as any other request's would.
"""

from twisted.logger import Logger

from brokerd.access.commands import AccessCommands
from brokerd.access.database import AccessDatabase
from brokerd.errors import AccessRefused, BrokerError, ChannelError, InternalError
from brokerd.proto.native_pb2 import Envelope, ManagementReply

REPLY_PART_BYTES = 1024 * 1024  # rows per reply frame, in encoded bytes: far below any frame limit

log = Logger()


def management_serving(broker, authenticator=None):
    """
    The L{AccessCommands} of C{broker} and the access database of C{authenticator}
    (the object logins are checked by, which AMQP shares); without one, of a
    database in memory holding guest/guest only, as such a listener's logins.
    """
    access = authenticator.access if authenticator is not None else AccessDatabase.in_memory()
    return AccessCommands(broker, access)


def answer_management_request(protocol, envelope, request):
    """Carry out C{request} for C{protocol}'s connection and answer it when done (or refuse it)."""
    connection = protocol.connection
    connection.channel(envelope.channel)  # 504 CHANNEL_ERROR unless the channel is open
    if protocol.management is None:
        raise AccessRefused("management is not served on this listener")
    d = protocol.management.run(
        connection.user, request.command, list(request.arguments), request.vhost,
        request.backend or None,
    )
    d.addCallbacks(_answer, _refuse, callbackArgs=(protocol, envelope),
                   errbackArgs=(protocol, envelope, request.command))


def _still_open(protocol, envelope):
    """Whether the request's channel is still there to answer (the change may have closed it)."""
    connection = protocol.connection
    return (
        connection is not None
        and not protocol.stopped_reading
        and envelope.channel in connection.channels
    )


def _answer(table, protocol, envelope):
    if not _still_open(protocol, envelope):
        return
    for part in reply_parts(table.columns, table.rows):
        reply = Envelope(channel=envelope.channel, correlation_id=envelope.correlation_id)
        reply.management_reply.CopyFrom(part)
        protocol.sendFrame(reply.SerializeToString())


def _refuse(failure, protocol, envelope, command):
    error = failure.value
    if not isinstance(error, BrokerError):
        log.failure("native management command {command!r} failed", failure, command=command)
        error = InternalError(f"the broker failed to carry out {command}; see its log")
    if not _still_open(protocol, envelope):
        return
    if isinstance(error, ChannelError):
        protocol.close_channel(envelope.channel, error, envelope.correlation_id)
    else:
        protocol.close_connection(error)


def reply_parts(columns, rows, part_bytes=REPLY_PART_BYTES):
    """
    The ManagementReply messages carrying a table: the first with the columns,
    all but the last with more.
    """
    part = ManagementReply()
    part.columns.extend(columns)
    parts, size = [part], 0
    for values in rows:
        # Near enough: tags, lengths.
        row_size = sum(len(value.encode("utf-8")) + 4 for value in values) + 4
        if size and size + row_size > part_bytes:
            part.more = True
            part = ManagementReply()
            parts.append(part)
            size = 0
        part.rows.add().values.extend(values)
        size += row_size
    return parts
