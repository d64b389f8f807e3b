"""A minimal AMQP 0-9-1 client on a plain socket, for tests that need to
control every frame (and every byte) themselves; frames come from pamqp."""

import socket

from pamqp import commands, frame, header
from pamqp import body as pamqp_body

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"


class RawAmqp:
    """One connection; C{handshake()} logs in as guest and opens vhost /."""

    def __init__(self, host, port, timeout=10.0, receive_buffer=None):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(timeout)
        self.sock.connect((host, port))
        self.buffer = b""
        self.offset = 0  # where the next unread frame starts in buffer
        self.frame_max = 131072

    def close(self):
        self.sock.close()

    def handshake(self, heartbeat=0, capabilities=None):
        self.sock.sendall(PROTOCOL_HEADER)
        self.expect(commands.Connection.Start)
        client_properties = {"product": "rawamqp", "capabilities": capabilities or {"connection.blocked": True}}
        self.send(0, commands.Connection.StartOk(client_properties=client_properties, response="\0guest\0guest"))
        tune = self.expect(commands.Connection.Tune)
        self.frame_max = tune.frame_max
        self.send(0, commands.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max,
                                                heartbeat=heartbeat))
        self.send(0, commands.Connection.Open(virtual_host="/"))
        self.expect(commands.Connection.OpenOk)

    def send(self, channel, *values):
        self.sock.sendall(b"".join(frame.marshal(value, channel) for value in values))

    def open_channel(self, channel=1):
        self.send(channel, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk)

    def read_frame(self):
        """The next C{(channel, frame)}; raises ConnectionError if the broker closed."""
        while True:
            buffer, offset = self.buffer, self.offset
            if buffer.startswith(b"AMQP", offset) and len(buffer) - offset >= 8:
                self.offset += 8
                return 0, buffer[offset : offset + 8]  # the broker refused our protocol header
            if len(buffer) - offset >= 7:
                size = int.from_bytes(buffer[offset + 3 : offset + 7], "big")
                end = offset + 8 + size
                if len(buffer) >= end:
                    self.offset = end
                    _, channel, value = frame.unmarshal(buffer[offset:end])
                    return channel, value
            data = self.sock.recv(262144)
            if not data:
                raise ConnectionError("the broker closed the connection")
            self.buffer = buffer[offset:] + data
            self.offset = 0

    def expect(self, method_class):
        """Read frames until one of C{method_class}; a close instead raises AssertionError."""
        while True:
            _, value = self.read_frame()
            if isinstance(value, method_class):
                return value
            if isinstance(value, (commands.Connection.Close, commands.Channel.Close)):
                raise AssertionError(f"expected {method_class.name}, got {value!r}")


def publish_frames(channel, routing_key, body, exchange="", properties=None):
    """The three frames of one basic.publish, as bytes."""
    properties = properties or commands.Basic.Properties()
    return b"".join(
        (
            frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=routing_key), channel),
            frame.marshal(header.ContentHeader(0, len(body), properties), channel),
            frame.marshal(pamqp_body.ContentBody(body), channel) if body else b"",
        )
    )
