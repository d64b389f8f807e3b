"""A minimal native-protocol client on a plain socket, for tests that send
envelopes the Twisted client would not build (out-of-range properties, raw
field values) and read every envelope back, each wait with a deadline."""

import socket
import struct
import time

from brokerd.native.framing import PROTOCOL_VERSION
from brokerd.proto.native_pb2 import Envelope

TIMEOUT = 5.0  # the longest any single wait on the broker may take
_LENGTH = struct.Struct(">I")


class ConnectionClosed(ConnectionError):
    """The broker closed the socket."""


class RawNative:
    """One native connection to C{endpoint} ("tcp:host:port"); C{hello()} opens it."""

    def __init__(self, endpoint, timeout=TIMEOUT):
        _, host, port = endpoint.split(":")
        self.timeout = timeout
        self.sock = socket.create_connection((host, int(port)), timeout)
        self.buffer = b""
        self._correlation = 0

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def send(self, envelope):
        """Send one envelope; returns its correlation id (a fresh one unless it has one)."""
        if not envelope.correlation_id:
            self._correlation += 1
            envelope.correlation_id = self._correlation
        frame = envelope.SerializeToString()
        self.sock.sendall(_LENGTH.pack(len(frame)) + frame)
        return envelope.correlation_id

    def read(self, deadline=None):
        """The next envelope the broker sent, waiting for it until C{deadline} (monotonic)."""
        deadline = time.monotonic() + self.timeout if deadline is None else deadline
        while True:
            if len(self.buffer) >= 4:
                end = 4 + _LENGTH.unpack_from(self.buffer)[0]
                if len(self.buffer) >= end:
                    envelope = Envelope.FromString(self.buffer[4:end])
                    self.buffer = self.buffer[end:]
                    return envelope
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("no envelope from the broker in time")
            self.sock.settimeout(remaining)
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionClosed("the broker closed the socket")
            self.buffer += data

    def answer(self, envelope):
        """Send C{envelope} and return the broker's answer on its channel (a reply or a channel close)."""
        correlation_id = self.send(envelope)
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self.read(deadline)
            kind = reply.WhichOneof("payload")
            if kind == "connection_close":
                close = reply.connection_close
                raise AssertionError(f"the broker closed the connection: {close.reply_code} {close.reply_text}")
            if reply.channel == envelope.channel and (
                reply.correlation_id == correlation_id or kind == "channel_close"
            ):
                return reply

    def hello(self, vhost="/", username="guest", password="guest"):
        envelope = Envelope()
        envelope.hello.protocol_version = PROTOCOL_VERSION
        envelope.hello.vhost = vhost
        envelope.hello.client_name = "raw native test client"
        envelope.hello.username = username
        envelope.hello.password = password
        reply = self.answer(envelope)
        assert reply.WhichOneof("payload") == "hello_ok", reply
        return self

    def open_channel(self, channel):
        envelope = Envelope(channel=channel)
        envelope.channel_open.SetInParent()
        reply = self.answer(envelope)
        assert reply.WhichOneof("payload") == "ok", reply

    def expect_channel_close(self, reply, reply_code, *words):
        """C{reply} is a channel close with C{reply_code} and a text holding C{words}; answers close-ok."""
        assert reply.WhichOneof("payload") == "channel_close", reply
        close = reply.channel_close
        assert close.reply_code == reply_code, close.reply_text
        for word in words:
            assert word in close.reply_text, close.reply_text
        close_ok = Envelope(channel=reply.channel)
        close_ok.channel_close_ok.SetInParent()
        self.send(close_ok)
        return close.reply_text

    def publish(self, channel, exchange, routing_key, body, properties=None):
        """basic.publish; its answer (if any) comes later: a channel close for a refused one."""
        envelope = Envelope(channel=channel)
        publish = envelope.basic_publish
        publish.exchange = exchange
        publish.routing_key = routing_key
        publish.body = body
        if properties is not None:
            publish.properties.CopyFrom(properties)
        self.send(envelope)

    def refused_publish(self, channel, exchange, routing_key, body, properties, reply_code, *words):
        """A publish on a fresh C{channel} the broker must refuse with C{reply_code}; returns the reply text."""
        self.open_channel(channel)
        self.publish(channel, exchange, routing_key, body, properties)
        reply = self.read()
        return self.expect_channel_close(reply, reply_code, *words)
