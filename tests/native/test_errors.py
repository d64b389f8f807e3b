"""Malformed native-protocol input gets the right AMQP error while an already-connected client keeps working."""

import random

from twisted.internet import defer
from twisted.trial import unittest

from brokerd.native.client import ChannelClosed, ConnectionClosed, connect
from brokerd.native.framing import PROTOCOL_VERSION
from brokerd.proto.native_pb2 import Envelope
from tests.support.broker import connect_client, connect_raw, encode_frame, listen_native


def hello(version=PROTOCOL_VERSION, vhost="/"):
    envelope = Envelope()
    envelope.hello.protocol_version = version
    envelope.hello.vhost = vhost
    envelope.hello.client_name = "raw test connection"
    envelope.hello.username = envelope.hello.password = "guest"
    return envelope


def varint(number):
    out = bytearray()
    while True:
        low, number = number & 0x7F, number >> 7
        if not number:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


class NativeErrorTestCase(unittest.TestCase):
    """A broker on 127.0.0.1, a client that misbehaves, and a bystander client that must keep working."""

    timeout = 30
    max_frame_size = None

    @defer.inlineCallbacks
    def setUp(self):
        self.broker, self.endpoint = listen_native(self, max_frame_size=self.max_frame_size)
        self.bystander = yield connect_client(self, self.endpoint)
        self.round_trips = 0

    @defer.inlineCallbacks
    def assert_still_serving(self, client=None):
        """A full declare / publish / get / ack round trip on C{client} (the bystander by default)."""
        client = client or self.bystander
        self.round_trips += 1
        queue, body = f"still-serving-{self.round_trips}", b"still here %d" % self.round_trips
        channel = yield client.channel()
        yield channel.queue_declare(queue)
        channel.basic_publish("", queue, body)
        got = yield channel.basic_get(queue)
        self.assertEqual((got.body, got.routing_key), (body, queue))
        got.ack()
        self.assertIsNone((yield channel.basic_get(queue)))
        yield channel.close()

    @defer.inlineCallbacks
    def raw_answer(self, *chunks):
        """Write C{chunks} on a bare TCP connection; the envelopes the broker sent before it closed it."""
        raw = yield connect_raw(self, self.endpoint)
        for chunk in chunks:
            raw.write(chunk)
        yield raw.lost
        return raw.frames()

    def assert_connection_close(self, envelopes, reply_code, *words):
        """The broker's only answer was a connection close with C{reply_code} and text holding C{words}."""
        self.assertEqual([envelope.WhichOneof("payload") for envelope in envelopes], ["connection_close"])
        close = envelopes[0].connection_close
        self.assertEqual(close.reply_code, reply_code, close.reply_text)
        for word in words:
            self.assertIn(word, close.reply_text)

    @defer.inlineCallbacks
    def assert_client_closed(self, client, reply_code, *words):
        """C{client}'s connection ends with ConnectionClosed C{reply_code} and a text holding C{words}."""
        reason = yield client.closed
        self.assertIsInstance(reason, ConnectionClosed)
        self.assertEqual(reason.reply_code, reply_code, reason.reply_text)
        for word in words:
            self.assertIn(word, reason.reply_text)
        return reason


class UnreadableInputTests(NativeErrorTestCase):
    @defer.inlineCallbacks
    def test_random_bytes_close_only_that_connection_with_frame_error(self):
        noise = bytearray(random.Random(501).randbytes(4096))
        noise[0] |= 0x80  # as most random prefixes do, it announces a frame far over the limit
        envelopes = yield self.raw_answer(bytes(noise))
        self.assert_connection_close(envelopes, 501, "FRAME_ERROR", "larger than the limit")
        yield self.assert_still_serving()

    @defer.inlineCallbacks
    def test_http_request_on_the_native_port_gets_frame_error(self):
        envelopes = yield self.raw_answer(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        self.assert_connection_close(envelopes, 501, "FRAME_ERROR")
        yield self.assert_still_serving()

    @defer.inlineCallbacks
    def test_random_bytes_inside_a_well_formed_length_prefix_get_frame_error(self):
        envelopes = yield self.raw_answer(encode_frame(b"\xff" * 64))
        self.assert_connection_close(envelopes, 501, "FRAME_ERROR", "64 bytes", "not a valid envelope")
        yield self.assert_still_serving()

    @defer.inlineCallbacks
    def test_invalid_envelope_from_a_connected_client_gets_frame_error(self):
        client = yield connect_client(self, self.endpoint)
        client.sendFrame(b"\x0a\xff\x01 truncated length-delimited field")
        yield self.assert_client_closed(client, 501, "FRAME_ERROR", "not a valid envelope")
        yield self.assert_still_serving()


class OversizedFrameTests(NativeErrorTestCase):
    max_frame_size = 64 * 1024

    @defer.inlineCallbacks
    def test_publish_over_the_frame_limit_closes_the_connection_with_frame_error(self):
        client = yield connect_client(self, self.endpoint)
        channel = yield client.channel()
        yield channel.queue_declare("small-frames")
        channel.basic_publish("", "small-frames", b"x" * (256 * 1024))
        pending = channel.queue_declare("small-frames", passive=True)

        yield self.assert_client_closed(client, 501, "FRAME_ERROR", "larger than the limit of 65536 bytes")
        error = yield self.assertFailure(pending, ChannelClosed)
        self.assertEqual(error.reply_code, 501)
        yield self.assert_still_serving()
        declared = yield (yield self.bystander.channel()).queue_declare("small-frames", passive=True)
        self.assertEqual(declared.message_count, 0)

    @defer.inlineCallbacks
    def test_publish_just_under_the_frame_limit_is_accepted(self):
        channel = yield self.bystander.channel()
        yield channel.queue_declare("small-frames")
        body = b"y" * (self.max_frame_size - 100)  # leaves room for the envelope's other fields
        channel.basic_publish("", "small-frames", body)
        got = yield channel.basic_get("small-frames", no_ack=True)
        self.assertEqual(len(got.body), len(body))


class ConnectionLevelErrorTests(NativeErrorTestCase):
    @defer.inlineCallbacks
    def test_unknown_request_gets_not_implemented(self):
        client = yield connect_client(self, self.endpoint)
        known_part = Envelope(channel=0, correlation_id=77).SerializeToString()
        unknown_field = varint(999 << 3 | 2) + varint(5) + b"hello"  # field 999, length-delimited
        client.sendFrame(known_part + unknown_field)
        yield self.assert_client_closed(client, 540, "NOT_IMPLEMENTED")
        yield self.assert_still_serving()

    @defer.inlineCallbacks
    def test_server_only_payload_from_a_client_gets_command_invalid(self):
        client = yield connect_client(self, self.endpoint)
        channel = yield client.channel()
        envelope = Envelope(channel=channel.id)
        envelope.basic_deliver.consumer_tag = "forged"
        envelope.basic_deliver.delivery_tag = 1
        envelope.basic_deliver.body = b"I am not the broker"
        client.sendFrame(envelope.SerializeToString())
        yield self.assert_client_closed(client, 503, "COMMAND_INVALID", "basic_deliver")
        yield self.assert_still_serving()

    @defer.inlineCallbacks
    def test_request_before_hello_gets_unexpected_frame(self):
        request = Envelope(channel=1, correlation_id=1)
        request.queue_declare.queue = "too-early"
        envelopes = yield self.raw_answer(encode_frame(request))
        self.assert_connection_close(envelopes, 505, "UNEXPECTED_FRAME", "hello", "queue_declare")
        yield self.assert_still_serving()
        channel = yield self.bystander.channel()
        error = yield self.assertFailure(channel.queue_declare("too-early", passive=True), ChannelClosed)
        self.assertEqual(error.reply_code, 404)

    @defer.inlineCallbacks
    def test_hello_with_another_protocol_version_is_refused_naming_both_versions(self):
        envelopes = yield self.raw_answer(encode_frame(hello(version=PROTOCOL_VERSION + 41)))
        self.assert_connection_close(envelopes, 503, str(PROTOCOL_VERSION + 41), str(PROTOCOL_VERSION))
        self.assertEqual(len(self.broker.connections), 1)  # only the bystander's
        yield self.assert_still_serving()

    @defer.inlineCallbacks
    def test_second_hello_is_refused(self):
        envelopes = yield self.raw_answer(encode_frame(hello()) + encode_frame(hello()))
        kinds = [envelope.WhichOneof("payload") for envelope in envelopes]
        self.assertEqual(kinds, ["hello_ok", "connection_close"])
        self.assertEqual(envelopes[1].connection_close.reply_code, 503)
        self.assertIn("hello", envelopes[1].connection_close.reply_text)
        yield self.assert_still_serving()

    @defer.inlineCallbacks
    def test_hello_to_an_unknown_vhost_gets_not_allowed(self):
        from twisted.internet import reactor

        error = yield self.assertFailure(connect(reactor, self.endpoint, vhost="/nowhere"), ConnectionClosed)
        self.assertEqual(error.reply_code, 530)
        self.assertIn("NOT_ALLOWED", error.reply_text)
        self.assertIn("/nowhere", error.reply_text)
        yield self.assert_still_serving()

    @defer.inlineCallbacks
    def test_request_on_a_channel_never_opened_closes_the_connection_with_channel_error(self):
        client = yield connect_client(self, self.endpoint)
        open_channel = yield client.channel()
        stray = Envelope(channel=42, correlation_id=999)
        stray.queue_declare.queue = "stray"
        client.sendFrame(stray.SerializeToString())
        pending = open_channel.queue_declare("sent-after-the-stray-request")
        reason = yield self.assert_client_closed(client, 504, "CHANNEL_ERROR", "channel 42 is not open")
        error = yield self.assertFailure(pending, ChannelClosed)  # the broker stopped reading at the error
        self.assertEqual((error.reply_code, error.reply_text), (reason.reply_code, reason.reply_text))
        yield self.assertFailure(open_channel.queue_declare("late"), ChannelClosed)
        yield self.assert_still_serving()

    @defer.inlineCallbacks
    def test_opening_a_channel_twice_closes_the_connection_with_channel_error(self):
        client = yield connect_client(self, self.endpoint)
        channel = yield client.channel()
        again = Envelope(channel=channel.id, correlation_id=1000)
        again.channel_open.SetInParent()
        client.sendFrame(again.SerializeToString())
        reason = yield self.assert_client_closed(client, 504, "CHANNEL_ERROR", f"channel {channel.id}", "already open")
        self.assertEqual((yield channel.closed).reply_code, reason.reply_code)
        yield self.assert_still_serving()


class ChannelLevelErrorTests(NativeErrorTestCase):
    @defer.inlineCallbacks
    def test_queue_name_over_255_bytes_closes_only_that_channel_with_precondition_failed(self):
        client = yield connect_client(self, self.endpoint)
        faulty, healthy = yield defer.gatherResults([client.channel(), client.channel()])
        error = yield self.assertFailure(faulty.queue_declare("q" * 256), ChannelClosed)
        self.assertEqual(error.reply_code, 406)
        self.assertIn("PRECONDITION_FAILED", error.reply_text)
        self.assertIn("queue name is 256 bytes", error.reply_text)
        self.assertEqual((yield faulty.closed).reply_code, 406)

        declared = yield healthy.queue_declare("q" * 255)  # the limit itself is fine
        self.assertEqual(declared.queue, "q" * 255)
        error = yield self.assertFailure(healthy.queue_declare("é" * 128), ChannelClosed)  # 128 chars, 256 bytes
        self.assertEqual(error.reply_code, 406)
        yield self.assert_still_serving(client)
        yield self.assert_still_serving()

    @defer.inlineCallbacks
    def test_channel_error_fails_that_channels_pending_requests_and_spares_the_rest(self):
        client = yield connect_client(self, self.endpoint)
        faulty, healthy = yield defer.gatherResults([client.channel(), client.channel()])
        consume = faulty.basic_consume("missing", lambda delivery: None)
        after = [faulty.queue_declare("after-the-error"), faulty.basic_get("missing")]
        healthy_declare = healthy.queue_declare("healthy")

        error = yield self.assertFailure(consume, ChannelClosed)
        self.assertEqual(error.reply_code, 404)
        self.assertIn("NOT_FOUND", error.reply_text)
        self.assertIn("missing", error.reply_text)
        for request in after:
            error = yield self.assertFailure(request, ChannelClosed)
            self.assertEqual(error.reply_code, 404)
        self.assertEqual((yield faulty.closed).reply_code, 404)
        self.assertEqual((yield healthy_declare).queue, "healthy")

        error = yield self.assertFailure(faulty.queue_declare("too-late"), ChannelClosed)  # fails at once
        self.assertEqual(error.reply_code, 404)
        self.assertIsNone(client.close_reason)
        yield self.assert_still_serving(client)  # on a new channel of the same connection
        healthy.basic_publish("", "healthy", b"still fine")
        self.assertEqual((yield healthy.basic_get("healthy")).body, b"still fine")
        yield self.assert_still_serving()

        probe = yield self.bystander.channel()  # requests sent after the error were dropped, not run
        error = yield self.assertFailure(probe.queue_declare("after-the-error", passive=True), ChannelClosed)
        self.assertEqual(error.reply_code, 404)

    @defer.inlineCallbacks
    def test_ack_of_an_unknown_delivery_tag_closes_the_channel_with_precondition_failed(self):
        client = yield connect_client(self, self.endpoint)
        channel = yield client.channel()
        channel.basic_ack(99)
        reason = yield channel.closed
        self.assertEqual(reason.reply_code, 406)
        self.assertIn("unknown delivery tag 99", reason.reply_text)
        yield self.assert_still_serving(client)
        yield self.assert_still_serving()

    @defer.inlineCallbacks
    def test_publish_to_a_missing_exchange_closes_the_channel_and_fails_its_confirm(self):
        client = yield connect_client(self, self.endpoint)
        channel = yield client.channel()
        yield channel.confirm_select()
        confirm = channel.basic_publish("no-such-exchange", "key", b"lost in transit")
        error = yield self.assertFailure(confirm, ChannelClosed)
        self.assertEqual(error.reply_code, 404)
        self.assertIn("no-such-exchange", error.reply_text)
        self.assertEqual((yield channel.closed).reply_code, 404)
        yield self.assert_still_serving(client)
        yield self.assert_still_serving()
