"""The crash tests' AMQP connection: whole deliveries and confirms of any channel, a dead broker as an exception.

Used by the client's publishers and consumer and by the drain after a restart.
"""

import struct

from benchmarks.amqp_client import (
    BASIC_ACK,
    BASIC_DELIVER,
    BASIC_NACK,
    BASIC_PUBLISH,
    CONFIRM_ARGUMENTS,
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_START,
    LONG_LONG,
    METHOD_INDEX,
    BenchmarkError,
    Connection,
    frame,
    short_string,
)
from benchmarks.crash_body import PERSISTENT_PROPERTIES


class BrokerGone(Exception):
    """The broker closed or reset the connection: in a crash test, it was killed."""


class CrashConnection(Connection):
    """
    An L{amqp_client.Connection} that hands whole deliveries (with their
    encoded properties and full body) and publisher confirms of any channel to
    the callbacks C{on_delivery(channel, delivery_tag, redelivered, properties,
    body)} and C{on_confirm(channel, delivery_tag, multiple, ack)}, calls
    C{after_read()} once per read, and turns a closed or reset socket into
    L{BrokerGone}.
    """

    def __init__(self, loop, host, port, name):
        self.on_delivery = self._no_delivery
        self.on_confirm = self._no_confirm
        self.after_read = lambda: None
        self._contents = {}  # channel -> [delivery tag, redelivered, properties, body pieces, bytes left]
        super().__init__(loop, host, port, name)

    def _no_delivery(self, channel, delivery_tag, *_):
        raise BenchmarkError(f"{self.name}: delivery {delivery_tag} on channel {channel} with no consumer")

    def _no_confirm(self, channel, delivery_tag, *_):
        raise BenchmarkError(f"{self.name}: confirm {delivery_tag} on channel {channel} with no publisher")

    def write(self, data):
        try:
            super().write(data)
        except OSError as error:
            raise BrokerGone(f"{self.name}: {error}") from None

    def on_writable(self):
        try:
            super().on_writable()
        except OSError as error:
            raise BrokerGone(f"{self.name}: {error}") from None

    def on_readable(self):
        try:
            data = self.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError as error:
            raise BrokerGone(f"{self.name}: {error}") from None
        if not data:
            raise BrokerGone(f"{self.name}: the broker closed the connection")
        if self.pending:
            data = self.pending + data
        offset = self._frames(data)
        self.pending = data[offset:] if offset < len(data) else b""
        self.after_read()

    def _frames(self, data):
        size = len(data)
        offset = 0
        contents = self._contents
        while size - offset >= 7:
            frame_type, channel, length = FRAME_START.unpack_from(data, offset)
            start = offset + 7
            end = start + length
            if end >= size:
                break
            if data[end] != FRAME_END:
                raise BenchmarkError(f"{self.name}: frame end byte is {data[end]:#04x}, not 0xce")
            if frame_type == FRAME_BODY:
                content = contents.get(channel)
                if content is None or content[4] < length:
                    raise BenchmarkError(f"{self.name}: unexpected body frame on channel {channel}")
                content[3].append(data[start:end])
                content[4] -= length
                if content[4] == 0:
                    self._complete(channel)
            elif frame_type == FRAME_METHOD:
                (index,) = METHOD_INDEX.unpack_from(data, start)
                if index == BASIC_DELIVER:
                    if channel in contents:
                        raise BenchmarkError(f"{self.name}: basic.deliver before the last content was complete")
                    tag_at = start + 5 + data[start + 4]
                    (delivery_tag,) = LONG_LONG.unpack_from(data, tag_at)
                    contents[channel] = [delivery_tag, bool(data[tag_at + 8] & 1), None, [], None]
                elif index == BASIC_ACK or index == BASIC_NACK:
                    delivery_tag, flags = CONFIRM_ARGUMENTS.unpack_from(data, start + 4)
                    self.on_confirm(channel, delivery_tag, bool(flags & 1), index == BASIC_ACK)
                else:
                    self._method(data[offset : end + 1])
            elif frame_type == FRAME_HEADER:
                content = contents.get(channel)
                if content is None or content[2] is not None:
                    raise BenchmarkError(f"{self.name}: unexpected content header on channel {channel}")
                (body_size,) = LONG_LONG.unpack_from(data, start + 4)
                content[2] = bytes(data[start + 12 : end])
                content[4] = body_size
                if body_size == 0:
                    self._complete(channel)
            elif frame_type != FRAME_HEARTBEAT:
                raise BenchmarkError(f"{self.name}: unknown frame type {frame_type}")
            offset = end + 1
        return offset

    def _complete(self, channel):
        delivery_tag, redelivered, properties, pieces, _ = self._contents.pop(channel)
        self.on_delivery(channel, delivery_tag, redelivered, properties, b"".join(pieces))

    def publish(self, routing_key, body, channel=Connection.CHANNEL, properties=PERSISTENT_PROPERTIES):
        """Writes one basic.publish to the default exchange (no confirm bookkeeping)."""
        self.write(publish_frames(channel, routing_key, body, properties, self.frame_max))

    def ack(self, delivery_tag, multiple=False, channel=Connection.CHANNEL):
        self.write(
            FRAME_START.pack(FRAME_METHOD, channel, 13)
            + METHOD_INDEX.pack(BASIC_ACK)
            + LONG_LONG.pack(delivery_tag)
            + (b"\x01" if multiple else b"\x00")
            + bytes((FRAME_END,))
        )


def publish_frames(channel, routing_key, body, properties, frame_max):
    """The frames of one basic.publish of C{body} to the default exchange."""
    method = frame(
        FRAME_METHOD,
        channel,
        METHOD_INDEX.pack(BASIC_PUBLISH) + b"\x00\x00" + short_string("") + short_string(routing_key) + b"\x00",
    )
    header = frame(FRAME_HEADER, channel, struct.pack(">HHQ", 60, 0, len(body)) + properties)
    largest = frame_max - 8
    bodies = [frame(FRAME_BODY, channel, body[at : at + largest]) for at in range(0, len(body), largest)]
    return b"".join([method, header, *bodies])
