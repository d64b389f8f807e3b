"""One open AMQP channel, both ways: the client's content in, the broker's pushes out.

The frame receiver (L{brokerd.amqp.server}) makes an L{AmqpChannel} on
channel.open and hands it every later frame of that channel. The channel holds
its own state: the model's L{brokerd.session.channel.Channel} it calls, whether the
broker closed it and waits for the client's close-ok (its frames are dropped
meanwhile), and the content being assembled: a basic.publish method frame, its
content header and its body frames become one L{Message}. basic.publish and
basic.ack take a struct-based path (L{brokerd.amqp.frames}); every other method
is decoded by L{brokerd.amqp.table_arguments} and handed to L{brokerd.amqp.methods}.
A L{ChannelError} closes only this channel.

It is also the L{IChannelPeer} the model's channel pushes deliveries, returns,
confirms and cancels to. Deliveries reuse the content-header bytes a message
was published with (L{Message.encoded_properties}); a message that came another
way has its properties encoded once and kept, and messages that share one
properties object (a paging store reads each kind of head once) share its
encoding. Bodies are handed to the transport as they are, split into frames
only when they exceed the negotiated frame size.
"""

from pamqp import commands
from twisted.logger import Logger
from zope.interface import implementer

from brokerd.amqp import frames, methods
from brokerd.amqp.properties import decode_properties, encode_properties
from brokerd.amqp.table_arguments import decode_method
from brokerd.errors import (
    ChannelError,
    CommandInvalid,
    FrameError,
    InvalidChannel,
    MethodNotImplemented,
    PreconditionFailed,
    UnexpectedFrame,
)
from brokerd.interfaces import IChannelPeer
from brokerd.model.message import Message

log = Logger()

# Publishers tend to send the same property bytes again and again; each distinct
# encoding is decoded (and checked) once per connection and its result shared.
PROPERTIES_CACHE_SIZE = 256
ENCODED_CACHE_ENTRIES = 256  # properties objects whose encoding is remembered
DELIVER_FRAMES_CACHED = 64  # per channel: consumer, exchange and routing key kinds of basic.deliver
CHANNEL_OPEN = frames.method_index(20, 10)
_CHANNEL_CLOSE = frames.method_index(20, 40)
_CHANNEL_CLOSE_OK = frames.method_index(20, 41)

# id(properties) -> (properties, encoded): holding it keeps its id from being reused
_encoded_by_properties = {}


def encoded_properties(message):
    """
    The message's properties in AMQP form, encoded at most once per message and
    per shared properties object.
    """
    encoded = message.encoded_properties
    if encoded is None:
        properties = message.properties
        cached = _encoded_by_properties.get(id(properties))
        if cached is not None:
            encoded = cached[1]
        else:
            encoded = encode_properties(properties)
            if len(_encoded_by_properties) >= ENCODED_CACHE_ENTRIES:
                _encoded_by_properties.clear()
            _encoded_by_properties[id(properties)] = (properties, encoded)
        message.encoded_properties = encoded
    return encoded


class PublishedContent:
    """
    What the channels of one connection share for the content their client
    publishes: the memory watermark, the body bytes held in unfinished contents
    (counted against it), the largest body allowed, and the decoded properties
    of each distinct encoding (L{PROPERTIES_CACHE_SIZE} at most).
    """

    __slots__ = ("watermark", "body_bytes", "max_message_size", "decoded_properties")

    def __init__(self, watermark, body_bytes, max_message_size):
        self.watermark = watermark
        self.body_bytes = body_bytes  # a HeldBytes
        self.max_message_size = max_message_size
        self.decoded_properties = {}  # encoded properties -> BasicProperties


@implementer(IChannelPeer)
class AmqpChannel:
    """
    One open channel of one AMQP connection.

    @ivar id: the channel number.
    @ivar model: the model's channel every method is translated into.
    @ivar writes: the connection's L{brokerd.wire.write_buffer.WriteBuffer}.
    @ivar frame_max: the negotiated frame size, for the content sent.
    @ivar closing: True once the broker closed it, until the client's close-ok.
    """

    __slots__ = (
        "id", "model", "writes", "frame_max", "closing", "publish", "properties", "body_size",
        "parts", "received", "_receiver", "_connection", "_gate", "_cancel_notify",
        "_deliver_frames", "_body_bytes", "_watermark", "_decoded_properties", "_max_message_size",
        "_disk_alarm", "_in_sync_alarm",
    )

    def __init__(self, channel_id, receiver, connection, gate, frame_max, cancel_notify):
        """
        Open channel C{channel_id} on the model's C{connection}.

        @param receiver: the connection's frame receiver: its C{writes}, its
            C{content} (a L{PublishedContent}), and C{forget_channel(id)},
            called when a close handshake ends and the number is free again.
        @param gate: the connection's L{brokerd.wire.backpressure.PublisherGate}.
        @param cancel_notify: whether the client takes basic.cancel from the broker.
        """
        content = receiver.content
        self.id = channel_id
        self.writes = receiver.writes
        self.frame_max = frame_max
        self.closing = False  # we sent channel.close and wait for close-ok
        self.publish = None  # (exchange, routing key, mandatory) awaiting content
        self.properties = None  # encoded properties, once the content header came
        self.body_size = 0
        self.parts = None
        self.received = 0  # body bytes held in parts, counted against the watermark
        self._receiver = receiver
        self._connection = connection
        self._gate = gate
        self._cancel_notify = cancel_notify
        # (consumer tag, exchange, routing key) -> its basic.deliver frame around the delivery tag
        self._deliver_frames = {}
        self._body_bytes = content.body_bytes
        self._watermark = content.watermark
        self._disk_alarm = connection.broker.disk_alarm
        self._in_sync_alarm = connection.broker.in_sync_alarm
        self._decoded_properties = content.decoded_properties
        self._max_message_size = content.max_message_size
        self.model = connection.open_channel(channel_id, self)

    # -- frames from the client

    def method_frame(self, index, data, start, end):
        """The method C{index} whose arguments are C{data[start:end]}."""
        if self.closing:
            if index == _CHANNEL_CLOSE_OK or index == _CHANNEL_CLOSE:
                self._receiver.forget_channel(self.id)
                if index == _CHANNEL_CLOSE:
                    self.writes.send(frames.method_frame(self.id, commands.Channel.CloseOk()))
            return
        if index == CHANNEL_OPEN:
            raise InvalidChannel(
                f"second 'channel.open' for channel {self.id}, which is already open"
            )
        if self.publish is not None:
            raise UnexpectedFrame(
                f"expected content header for class 60, got method {frames.method_name(index)}"
                f" on channel {self.id}"
            )
        if index == frames.BASIC_PUBLISH:
            exchange, routing_key, mandatory, immediate = frames.decode_publish(data, start, end)
            if immediate:
                raise MethodNotImplemented("immediate=true")
            self.publish = (exchange, routing_key, mandatory)
            return
        try:
            if index == frames.BASIC_ACK:
                self.model.basic_ack(*frames.decode_ack(data, start, end))
                return
            handler = methods.CHANNEL_METHODS.get(index)
            if handler is None:
                raise _not_a_channel_method(index)
            handler(self, decode_method(index, data, start, end, PreconditionFailed))
        except ChannelError as error:
            self.close(error, index)

    def header_frame(self, data, start, end):
        if self.publish is None or self.properties is not None:
            raise UnexpectedFrame(
                f"content header frame on channel {self.id} without a basic.publish before it"
            )
        class_id, body_size, properties_start = frames.decode_content_header(data, start, end)
        if class_id != frames.BASIC_CLASS:
            raise UnexpectedFrame(f"content header for class {class_id}, expected class 60 (basic)")
        if body_size > self._max_message_size:
            self.publish = None
            error = PreconditionFailed(
                f"message size {body_size} is larger than configured max size"
                f" {self._max_message_size}"
            )
            self.close(error, frames.BASIC_PUBLISH)
            return
        properties = data[properties_start:end]
        if not body_size:
            self._publish(properties, b"")
            return
        self.properties = properties
        self.body_size = body_size
        self.parts = []
        self.received = 0

    def body_frame(self, data, start, end):
        if self.properties is None:
            raise UnexpectedFrame(
                f"content body frame on channel {self.id} without a content header before it"
            )
        received = self.received + end - start
        if received > self.body_size:
            raise FrameError(
                f"content body is longer than the {self.body_size} bytes its header announced"
            )
        parts = self.parts
        if received == self.body_size:
            if parts:
                parts.append(memoryview(data)[start:end])
                body = b"".join(parts)
            else:
                body = data[start:end]
            self._publish(self.properties, body)
        else:
            size = end - start
            if len(data) - size > size >> 2:
                # A view would keep the whole read alive, which may be far larger than the part
                # counted against the watermark (small body frames among other frames): copy it.
                parts.append(data[start:end])
            else:
                parts.append(memoryview(data)[start:end])
            self.received = received
            self._body_bytes.add(size)
            if self._watermark.blocked:
                # A body on its way holds memory: its sender is a publisher to block.
                self._gate.check()

    def _publish(self, properties, body):
        exchange, routing_key, mandatory = self.publish
        self.publish = self.properties = self.parts = None
        if self.received:
            self.release_content()
        decoded = self._decoded_properties.get(properties)
        if decoded is None:
            try:
                # Malformed properties are a connection error (502).
                decoded = decode_properties(properties)
            except ChannelError as error:  # headers nested too deep: 406 closes this channel only
                self.close(error, frames.BASIC_PUBLISH)
                return
            if len(self._decoded_properties) >= PROPERTIES_CACHE_SIZE:
                self._decoded_properties.clear()
            self._decoded_properties[properties] = decoded
        message = Message(exchange, routing_key, decoded, body, properties)
        try:
            self.model.publish(message, mandatory)
        except ChannelError as error:
            self.close(error, frames.BASIC_PUBLISH)
        if self._watermark.blocked or self._disk_alarm.blocked or self._in_sync_alarm.blocked:
            self._gate.check()

    def release_content(self):
        """
        The content being assembled was published or dropped: its body bytes
        leave the watermark.
        """
        received, self.received = self.received, 0
        if received:
            self._body_bytes.release(received)

    def drop_content(self):
        """
        Let go of the content being assembled (the connection closed; what it
        counted is released with the connection's): the model's channel may
        still refer to this object, and its body parts must not stay alive with it.
        """
        self.publish = self.properties = self.parts = None

    # -- closing

    def close_by_client(self):
        """channel.close from the client: close it and answer close-ok."""
        self._receiver.forget_channel(self.id)
        self.release_content()
        self.drop_content()
        self._connection.close_channel(self.id)
        self.writes.send(frames.method_frame(self.id, commands.Channel.CloseOk()))

    def close(self, error, index):
        """
        Close the channel for C{error} (raised by method C{index}) and wait for
        the client's close-ok.
        """
        log.debug("closing channel {channel}: {error}", channel=self.id, error=error)
        self._connection.close_channel(self.id)
        self.closing = True
        self.publish = self.properties = self.parts = None
        self.release_content()
        close = commands.Channel.Close(
            reply_code=error.reply_code, reply_text=frames.short_reply_text(error.reply_text),
            class_id=index >> 16, method_id=index & 0xFFFF,
        )
        self.writes.send(frames.method_frame(self.id, close))

    # -- IChannelPeer: what the broker pushes to the client

    def deliver(self, consumer_tag, delivery_tag, redelivered, message):
        self.deliver_run(consumer_tag, ((delivery_tag, redelivered, message),))

    def deliver_run(self, consumer_tag, deliveries):
        channel_id = self.id
        frame_max = self.frame_max
        deliver_frames = self._deliver_frames
        pack_tag = frames.DELIVERY_TAG.pack
        pieces = []
        size = 0
        # Everything is encoded before anything is queued, so a message that cannot be encoded never
        # leaves a basic.deliver without its content (which would hang the client).
        for delivery_tag, redelivered, message in deliveries:
            key = (consumer_tag, message.exchange, message.routing_key)
            around = deliver_frames.get(key)
            if around is None:
                if len(deliver_frames) >= DELIVER_FRAMES_CACHED:
                    deliver_frames.clear()
                around = deliver_frames[key] = frames.deliver_frame_around(
                    channel_id, consumer_tag.encode(), message.exchange.encode(),
                    message.routing_key.encode(),
                )
            body = message.body
            content = frames.content_frames(
                channel_id, encoded_properties(message), body, frame_max
            )
            pieces += (around[0], pack_tag(delivery_tag, redelivered), around[1])
            pieces += content
            size += len(body)
        self.writes.send_pieces(pieces, size)

    def returned(self, reply_code, reply_text, message):
        content = frames.content_frames(
            self.id, encoded_properties(message), message.body, self.frame_max
        )
        self.writes.send(frames.encode_return(
            self.id, reply_code, reply_text, message.exchange, message.routing_key
        ))
        self.writes.send_pieces(content, len(message.body))

    def get_ok(self, delivery_tag, redelivered, message, message_count):
        """basic.get-ok with C{message}, as the model's basic_get returned it."""
        content = frames.content_frames(
            self.id, encoded_properties(message), message.body, self.frame_max
        )
        self.writes.send(
            frames.encode_get_ok(
                self.id, delivery_tag, redelivered, message.exchange, message.routing_key,
                message_count,
            )
        )
        self.writes.send_pieces(content, len(message.body))

    def publish_confirmed(self, sequence, multiple, ack):
        self.writes.send(frames.encode_confirm(self.id, sequence, multiple, ack))

    def consumer_cancelled(self, consumer_tag):
        self.forget_consumer(consumer_tag)
        if self._cancel_notify:
            self.writes.send(frames.encode_cancel(self.id, consumer_tag))

    def forget_consumer(self, consumer_tag):
        """The client cancelled C{consumer_tag}: drop its cached encodings."""
        for key in [key for key in self._deliver_frames if key[0] == consumer_tag]:
            del self._deliver_frames[key]


def _not_a_channel_method(index):
    name = frames.method_name(index)
    if index >> 16 == 10:
        return CommandInvalid(f"{name} belongs on channel 0")
    if index in commands.INDEX_MAPPING:
        return CommandInvalid(f"{name} is sent by the server, not the client")
    return MethodNotImplemented(f"unknown method {name}")
