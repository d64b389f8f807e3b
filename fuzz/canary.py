"""The fuzzer's well-behaved clients: logins for inputs that need one, and the
canaries that prove the broker still serves after each hostile input.

A canary, in either protocol: log in, declare its durable queue, publish one
persistent message with confirms, wait for the confirm, get it back (acking
leftovers of earlier failed canaries on the way) and ack it; then get and ack
up to a few messages from the queue the hostile inputs publish to (a message
the broker took must be deliverable in both protocols), and close cleanly.
Every wait has a deadline; anything else than the expected answer fails it.
"""

import itertools
import struct
import time

from fuzz import wire
from fuzz.wire import Session

CANARY_QUEUE = "fuzz-canary"
SHARED_QUEUE = "fuzz-shared"  # hostile inputs publish here; canaries drain it
SHARED_GETS = 3  # messages a canary takes from the shared queue
LEFTOVERS = 50  # messages of earlier canaries one canary may skip in its own queue
NOT_FOUND = 404


class CanaryFailed(Exception):
    """The broker did not serve a well-behaved client as it should."""


_serial = itertools.count(1)


# -- AMQP


def read_amqp_frame(session, deadline):
    """The next C{(frame_type, channel, payload)}; raises CanaryFailed at the deadline or on garbage."""
    while True:
        buffer = session.buffer
        if buffer.startswith(b"AMQP"):
            raise CanaryFailed(f"the broker answered with a protocol header {buffer[:8]!r}")
        if len(buffer) >= 7:
            frame_type, channel, length = struct.unpack_from(">BHI", buffer)
            if len(buffer) >= length + 8:
                if buffer[length + 7] != wire.FRAME_END:
                    raise CanaryFailed(f"frame end byte {buffer[length + 7]:#x}")
                session.buffer = buffer[length + 8 :]
                return frame_type, channel, buffer[7 : length + 7]
        if not session.fill(deadline):
            what = "closed the connection" if session.closed_by_peer else "did not answer in time"
            raise CanaryFailed(f"the broker {what}")


def expect_method(session, deadline, wanted, channel=None):
    """Read frames until a method frame; it must be one of C{wanted}. Returns C{(method_id, channel, arguments)}."""
    while True:
        frame_type, got_channel, payload = read_amqp_frame(session, deadline)
        if frame_type == wire.FRAME_HEARTBEAT:
            continue
        if frame_type != wire.FRAME_METHOD:
            raise CanaryFailed(f"expected {wanted}, got a frame of type {frame_type}")
        method_id = struct.unpack_from(">HH", payload)
        arguments = payload[4:]
        if method_id in (wire.CONNECTION_CLOSE, wire.CHANNEL_CLOSE) and method_id not in wanted:
            code = struct.unpack_from(">H", arguments)[0]
            text = arguments[3 : 3 + arguments[2]].decode("utf-8", "replace")
            raise CanaryFailed(f"the broker closed the {'connection' if method_id[0] == 10 else 'channel'}: "
                               f"{code} {text}")
        if method_id not in wanted or (channel is not None and got_channel != channel):
            raise CanaryFailed(f"expected {wanted} on channel {channel}, got {method_id} on {got_channel}")
        return method_id, got_channel, arguments


def amqp_login(session, deadline, response=b"\0guest\0guest", mechanism="PLAIN"):
    """The handshake up to open-ok; returns the negotiated frame_max."""
    session.sock.sendall(wire.PROTOCOL_HEADER)
    expect_method(session, deadline, [wire.CONNECTION_START])
    session.sock.sendall(wire.start_ok(response, mechanism))
    _, _, tune = expect_method(session, deadline, [wire.CONNECTION_TUNE])
    channel_max, frame_max, _ = struct.unpack_from(">HIH", tune)
    session.sock.sendall(wire.tune_ok(channel_max, frame_max) + wire.connection_open())
    expect_method(session, deadline, [wire.CONNECTION_OPEN_OK])
    return frame_max


def _closed_instead(frame_type, payload):
    """The reply code and text of a close frame read where content was expected, else ''."""
    closes = (wire.CONNECTION_CLOSE, wire.CHANNEL_CLOSE)
    if frame_type == wire.FRAME_METHOD and len(payload) >= 7 and struct.unpack_from(">HH", payload) in closes:
        code = struct.unpack_from(">H", payload, 4)[0]
        return f": the broker closed instead: {code} {payload[7:7 + payload[6]].decode('utf-8', 'replace')}"
    return ""


def read_content(session, deadline, channel):
    """The body of the content that follows a get-ok or deliver."""
    frame_type, got_channel, payload = read_amqp_frame(session, deadline)
    if frame_type != wire.FRAME_HEADER or got_channel != channel:
        raise CanaryFailed(f"expected a content header on channel {channel}, got type {frame_type} on {got_channel}"
                           + _closed_instead(frame_type, payload))
    (size,) = struct.unpack_from(">Q", payload, 4)
    body = b""
    while len(body) < size:
        frame_type, got_channel, payload = read_amqp_frame(session, deadline)
        if frame_type != wire.FRAME_BODY or got_channel != channel:
            raise CanaryFailed(f"expected a body frame on channel {channel}, got type {frame_type}"
                               + _closed_instead(frame_type, payload))
        body += payload
    if len(body) != size:
        raise CanaryFailed(f"content of {len(body)} bytes; its header said {size}")
    return body


def amqp_get(session, deadline, channel, queue):
    """basic.get: C{(delivery_tag, body)}, or None when the queue is empty."""
    session.sock.sendall(wire.basic_get(channel, queue))
    method_id, _, arguments = expect_method(session, deadline, [wire.BASIC_GET_OK, wire.BASIC_GET_EMPTY], channel)
    if method_id == wire.BASIC_GET_EMPTY:
        return None
    (delivery_tag,) = struct.unpack_from(">Q", arguments)
    return delivery_tag, read_content(session, deadline, channel)


def amqp_canary(port, deadline, setup=False):
    """
    One AMQP canary run (see the module docstring); C{setup} also declares the
    shared queue. Returns how many messages it took from the shared queue.
    """
    token = f"canary-{next(_serial)}-{time.monotonic_ns()}".encode()
    session = Session(port, timeout=max(deadline - time.monotonic(), 0.1))
    stage = "login"
    try:
        frame_max = amqp_login(session, deadline)
        stage = "declare and publish"
        frames = [wire.channel_open(1), wire.queue_declare(1, CANARY_QUEUE, durable=True)]
        if setup:
            frames.append(wire.queue_declare(1, SHARED_QUEUE, durable=True))
        frames.append(wire.method(1, wire.CONFIRM_SELECT, wire.bits(False)))
        frames += wire.publish(1, CANARY_QUEUE, token, {"delivery_mode": 2}, frame_max=frame_max)
        session.sock.sendall(b"".join(frames))
        expect_method(session, deadline, [wire.CHANNEL_OPEN_OK], 1)
        expect_method(session, deadline, [wire.QUEUE_DECLARE_OK], 1)
        if setup:
            expect_method(session, deadline, [wire.QUEUE_DECLARE_OK], 1)
        expect_method(session, deadline, [wire.CONFIRM_SELECT_OK], 1)
        method_id, _, arguments = expect_method(session, deadline, [wire.BASIC_ACK, wire.BASIC_NACK], 1)
        if method_id == wire.BASIC_NACK:
            raise CanaryFailed("the broker nacked the canary's persistent publish")
        stage = "get and ack"
        for _ in range(LEFTOVERS):
            got = amqp_get(session, deadline, 1, CANARY_QUEUE)
            if got is None:
                raise CanaryFailed("the canary's confirmed message is not in its queue")
            session.sock.sendall(wire.basic_ack(1, got[0]))
            if got[1] == token:
                break
        else:
            raise CanaryFailed(f"the canary's message is not among the first {LEFTOVERS} of its queue")
        # The shared queue, on a channel of its own: a hostile input may have deleted it (404 closes only that).
        stage = f"draining {SHARED_QUEUE}"
        session.sock.sendall(wire.channel_open(2) + wire.queue_declare(2, SHARED_QUEUE, passive=True))
        expect_method(session, deadline, [wire.CHANNEL_OPEN_OK], 2)
        method_id, _, arguments = expect_method(session, deadline, [wire.QUEUE_DECLARE_OK, wire.CHANNEL_CLOSE], 2)
        drained = 0
        if method_id == wire.QUEUE_DECLARE_OK:
            for _ in range(SHARED_GETS):
                got = amqp_get(session, deadline, 2, SHARED_QUEUE)
                if got is None:
                    break
                session.sock.sendall(wire.basic_ack(2, got[0]))
                drained += 1
        elif struct.unpack_from(">H", arguments)[0] != NOT_FOUND:
            text = arguments[3 : 3 + arguments[2]].decode("utf-8", "replace")
            raise CanaryFailed(f"passive declare of {SHARED_QUEUE} closed its channel: {text}")
        else:
            session.sock.sendall(wire.method(2, wire.CHANNEL_CLOSE_OK))
        stage = "close"
        session.sock.sendall(wire.connection_close())
        expect_method(session, deadline, [wire.CONNECTION_CLOSE_OK])
        return drained
    except CanaryFailed as problem:
        raise CanaryFailed(f"amqp canary, {stage}: {problem}") from None
    except OSError as problem:
        raise CanaryFailed(f"amqp canary, {stage}: socket error: {problem}") from None
    finally:
        session.close()


# -- native


def read_envelope(session, deadline):
    """The next Envelope from the broker; raises CanaryFailed at the deadline or on garbage."""
    while True:
        buffer = session.buffer
        if len(buffer) >= 4:
            (length,) = struct.unpack_from(">I", buffer)
            if len(buffer) >= length + 4:
                session.buffer = buffer[length + 4 :]
                parsed = wire.Envelope()
                try:
                    parsed.ParseFromString(buffer[4 : length + 4])
                except Exception as problem:
                    raise CanaryFailed(f"unreadable envelope from the broker: {problem}") from None
                return parsed
        if not session.fill(deadline):
            what = "closed the connection" if session.closed_by_peer else "did not answer in time"
            raise CanaryFailed(f"the broker {what}")


def expect_envelope(session, deadline, wanted, channel=None):
    """The next envelope; its payload must be one of C{wanted}. Returns C{(kind, envelope)}."""
    parsed = read_envelope(session, deadline)
    kind = parsed.WhichOneof("payload")
    if kind in ("connection_close", "channel_close") and kind not in wanted:
        close = getattr(parsed, kind)
        raise CanaryFailed(f"the broker sent {kind}: {close.reply_code} {close.reply_text}")
    if kind not in wanted or (channel is not None and parsed.channel != channel):
        raise CanaryFailed(f"expected {wanted} on channel {channel}, got {kind} on {parsed.channel}")
    return kind, parsed


def native_login(session, deadline):
    session.sock.sendall(wire.native_frame(wire.native_hello()))
    expect_envelope(session, deadline, ["hello_ok"])


def _send(session, *envelopes):
    session.sock.sendall(b"".join(wire.native_frame(item) for item in envelopes))


def native_get(session, deadline, channel, queue):
    """basic_get: C{(delivery_tag, body)} or None when empty."""
    _send(session, wire.envelope("basic_get", channel, 9, queue=queue))
    kind, parsed = expect_envelope(session, deadline, ["basic_get_ok", "basic_get_empty"], channel)
    if kind == "basic_get_empty":
        return None
    return parsed.basic_get_ok.delivery_tag, parsed.basic_get_ok.body


def native_canary(port, deadline, setup=False):
    """
    One native canary run (see the module docstring); C{setup} also declares the
    shared queue. Returns how many messages it took from the shared queue.
    """
    token = f"canary-{next(_serial)}-{time.monotonic_ns()}".encode()
    session = Session(port, timeout=max(deadline - time.monotonic(), 0.1))
    stage = "hello"
    try:
        native_login(session, deadline)
        stage = "declare and publish"
        properties = wire.messages_pb2.BasicProperties(delivery_mode=2)
        envelopes = [wire.envelope("channel_open", 1, 1),
                     wire.envelope("queue_declare", 1, 2, queue=CANARY_QUEUE, durable=True)]
        if setup:
            envelopes.append(wire.envelope("queue_declare", 1, 3, queue=SHARED_QUEUE, durable=True))
        envelopes += [wire.envelope("confirm_select", 1, 4),
                      wire.envelope("basic_publish", 1, 0, routing_key=CANARY_QUEUE, body=token, properties=properties)]
        _send(session, *envelopes)
        expect_envelope(session, deadline, ["ok"], 1)
        expect_envelope(session, deadline, ["queue_declare_ok"], 1)
        if setup:
            expect_envelope(session, deadline, ["queue_declare_ok"], 1)
        expect_envelope(session, deadline, ["ok"], 1)
        kind, _ = expect_envelope(session, deadline, ["basic_ack", "basic_nack"], 1)
        if kind == "basic_nack":
            raise CanaryFailed("the broker nacked the canary's persistent publish")
        stage = "get and ack"
        for _ in range(LEFTOVERS):
            got = native_get(session, deadline, 1, CANARY_QUEUE)
            if got is None:
                raise CanaryFailed("the canary's confirmed message is not in its queue")
            _send(session, wire.envelope("basic_ack", 1, 0, delivery_tag=got[0]))
            if got[1] == token:
                break
        else:
            raise CanaryFailed(f"the canary's message is not among the first {LEFTOVERS} of its queue")
        stage = f"draining {SHARED_QUEUE}"
        _send(session, wire.envelope("channel_open", 2, 1),
              wire.envelope("queue_declare", 2, 2, queue=SHARED_QUEUE, passive=True))
        expect_envelope(session, deadline, ["ok"], 2)
        kind, parsed = expect_envelope(session, deadline, ["queue_declare_ok", "channel_close"], 2)
        drained = 0
        if kind == "queue_declare_ok":
            for _ in range(SHARED_GETS):
                got = native_get(session, deadline, 2, SHARED_QUEUE)
                if got is None:
                    break
                _send(session, wire.envelope("basic_ack", 2, 0, delivery_tag=got[0]))
                drained += 1
        elif parsed.channel_close.reply_code != NOT_FOUND:
            raise CanaryFailed(f"passive declare of {SHARED_QUEUE} closed its channel: "
                               f"{parsed.channel_close.reply_code} {parsed.channel_close.reply_text}")
        else:
            _send(session, wire.envelope("channel_close_ok", 2))
        stage = "close"
        _send(session, wire.envelope("connection_close", 0, 5))
        expect_envelope(session, deadline, ["connection_close_ok"])
        return drained
    except CanaryFailed as problem:
        raise CanaryFailed(f"native canary, {stage}: {problem}") from None
    except OSError as problem:
        raise CanaryFailed(f"native canary, {stage}: socket error: {problem}") from None
    finally:
        session.close()


def purge_shared(amqp_port, native_port, deadline):
    """Empty the shared queue through whichever protocol still works, so one poisoned message is reported once."""
    for purge in (_purge_amqp, _purge_native):
        try:
            purge(amqp_port if purge is _purge_amqp else native_port, deadline)
            return True
        except (CanaryFailed, OSError):
            continue
    return False


def _purge_amqp(port, deadline):
    session = Session(port, timeout=max(deadline - time.monotonic(), 0.1))
    try:
        amqp_login(session, deadline)
        session.sock.sendall(wire.channel_open(1) + wire.method(
            1, wire.QUEUE_PURGE, wire.short(0) + wire.shortstr(SHARED_QUEUE) + wire.bits(False)))
        expect_method(session, deadline, [wire.CHANNEL_OPEN_OK], 1)
        expect_method(session, deadline, [(50, 31)], 1)
    finally:
        session.close()


def _purge_native(port, deadline):
    session = Session(port, timeout=max(deadline - time.monotonic(), 0.1))
    try:
        native_login(session, deadline)
        _send(session, wire.envelope("channel_open", 1, 1), wire.envelope("queue_purge", 1, 2, queue=SHARED_QUEUE))
        expect_envelope(session, deadline, ["ok"], 1)
        expect_envelope(session, deadline, ["message_count"], 1)
    finally:
        session.close()
