"""Structured hostile inputs: each one a known way to hurt a broker, with seeded details.

Deeply nested tables in arguments and headers, long strings and declared
lengths far beyond their frame, typed and non-ASCII credentials, values out of
range, many channels, unfinished bodies, uncommitted transactions, clients that
do not read. The resource-abuse ones push L{OVERSHOOT} x C{volume} bytes (the
broker's memory watermark) at the broker: a broker that holds them all is over
its watermark by far more than its own baseline. L{make} picks one, by weight.
"""

import math
import struct

from brokerd.proto import messages_pb2
from fuzz import wire
from fuzz.canary import SHARED_QUEUE
from fuzz.wire import Raw

AMQP_METHODS = (
    (10, 11), (10, 31), (10, 40), (10, 50), (10, 51), (20, 10), (20, 20), (20, 21), (20, 40), (20, 41),
    (40, 10), (40, 20), (40, 30), (40, 40), (50, 10), (50, 20), (50, 30), (50, 40), (50, 50),
    (60, 10), (60, 20), (60, 30), (60, 40), (60, 70), (60, 80), (60, 90), (60, 100), (60, 110), (60, 120),
    (85, 10), (90, 10), (90, 20), (90, 30), (10, 60), (10, 61),
)
MiB = 1 << 20
OVERSHOOT = 2  # the resource-abuse inputs push this many times the watermark
HEAVY_SEND_SECONDS = 3.0  # resource-abuse inputs may take this long to send


def nested(rng, depth):
    """A value nested C{depth} levels deep (tables and arrays), ending in None."""
    value = None
    for _ in range(depth):
        value = {"a": value} if rng.random() < 0.6 else [value]
    return value


def nested_raw(rng, depth):
    """The AMQP encoding of a value nested C{depth} levels deep, built without recursion."""
    value = b"V"
    for _ in range(depth):
        if rng.random() < 0.6:
            entry = wire.shortstr("a") + value
            value = b"F" + wire.long_(len(entry)) + entry
        else:
            value = b"A" + wire.long_(len(value)) + value
    return Raw(value)


def amqp_login_frames(*frames):
    return [wire.channel_open(1), *frames]


# -- AMQP


def amqp_deep_arguments(rng, volume):
    depth = rng.randint(20, 60)
    arguments = {"x-a": nested_raw(rng, depth - 1)}
    target = rng.choice(("queue", "exchange", "bind", "consume"))
    if target == "queue":
        frame = wire.queue_declare(1, f"fuzz-deep-{rng.randrange(4)}", durable=True, arguments=arguments)
    elif target == "exchange":
        frame = wire.method(1, wire.EXCHANGE_DECLARE, wire.short(0) + wire.shortstr(f"fuzz-deep-x{rng.randrange(4)}")
                            + wire.shortstr("direct") + wire.bits(False, True) + wire.table(arguments))
    elif target == "bind":
        frame = wire.method(1, wire.QUEUE_BIND, wire.short(0) + wire.shortstr(SHARED_QUEUE)
                            + wire.shortstr("amq.direct") + wire.shortstr(f"deep{rng.randrange(4)}") + wire.bits(False)
                            + wire.table(arguments))
    else:
        consume = wire.short(0) + wire.shortstr("") + wire.shortstr("") + wire.bits() + wire.table(arguments)
        frame = wire.queue_declare(1, "", exclusive=True) + wire.method(1, wire.BASIC_CONSUME, consume)
    return dict(login=True, chunks=amqp_login_frames(frame), detail=f"{target} arguments nested {depth} deep")


def amqp_deep_headers(rng, volume):
    depth = rng.randint(20, 60)
    headers = {"h": nested_raw(rng, depth - 1)}
    frames = amqp_login_frames(wire.method(1, wire.CONFIRM_SELECT, wire.bits(False)),
                               *wire.publish(1, SHARED_QUEUE, b"deep", {"headers": headers, "delivery_mode": 2}))
    return dict(login=True, chunks=frames, detail=f"persistent message with headers nested {depth} deep")


def amqp_long_strings(rng, volume):
    variants = {
        "header long string declaring 2**31-1 bytes": lambda: wire.publish(
            1, SHARED_QUEUE, b"x", {"headers": {"s": Raw(b"S" + wire.long_(0x7FFFFFFF) + b"abc")}}),
        "arguments table declaring 0xFFFFFFF0 bytes": lambda: [wire.method(
            1, wire.QUEUE_DECLARE, wire.short(0) + wire.shortstr("fuzz-t") + wire.bits(False, False, True)
            + wire.long_(0xFFFFFFF0) + b"\x01a")],
        "array declaring 2**30 bytes": lambda: wire.publish(
            1, SHARED_QUEUE, b"x", {"headers": {"a": Raw(b"A" + wire.long_(1 << 30) + b"V")}}),
        "byte array declaring 2**28 bytes": lambda: wire.publish(
            1, SHARED_QUEUE, b"x", {"headers": {"a": Raw(b"x" + wire.long_(1 << 28))}}),
        "queue name cut inside a UTF-8 character": lambda: [wire.method(
            1, wire.QUEUE_DECLARE, wire.short(0) + wire.octet(254) + ("€" * 85).encode()[:254] + wire.bits()
            + wire.table({}))],
        "content header declaring 2**63 bytes": lambda: [
            wire.publish_method(1, SHARED_QUEUE),
            wire.amqp_frame(wire.FRAME_HEADER, 1, struct.pack(">HHQH", 60, 0, 1 << 63, 0)),
            wire.amqp_frame(wire.FRAME_BODY, 1, b"x" * 100)],
        "body longer than its header declared": lambda: [
            *wire.publish(1, SHARED_QUEUE, b"12345")[:2], wire.amqp_frame(wire.FRAME_BODY, 1, b"x" * 1000)],
        "shortstr length past the frame end": lambda: [wire.amqp_frame(
            wire.FRAME_METHOD, 1, struct.pack(">HH", *wire.BASIC_PUBLISH) + wire.short(0) + b"\xff" + b"ab")],
        "255-byte names and routing key": lambda: wire.publish(
            1, "r" * 255, b"x", {"message_id": "€" * 85, "content_type": "c" * 255}, exchange="e" * 255),
    }
    name = rng.choice(sorted(variants))
    return dict(login=True, chunks=amqp_login_frames(*variants[name]()), detail=name)


def amqplain_value(rng):
    return rng.choice((
        Raw(b"I" + struct.pack(">i", -5)), Raw(b"l" + struct.pack(">q", -(2**63))), Raw(b"d" + struct.pack(">d", 1.5)),
        Raw(b"f" + struct.pack(">f", math.nan)), Raw(b"D" + wire.octet(2) + wire.long_(12345)),
        wire.field_value([1, "guest"]), wire.field_value({"a": "guest"}), Raw(b"S" + wire.long_(1 << 28)),
        Raw(b"x" + wire.long_(1 << 28) + b"guest"), Raw(b"V"), Raw(b"t\x01"),
        Raw(b"T" + wire.longlong(2**64 - 1)), wire.field_value("gü€st"), Raw(b"S" + wire.longstr(b"\xff\xfe\xc3"))))


def amqp_amqplain_typed(rng, volume):
    login, password = amqplain_value(rng), rng.choice((amqplain_value(rng), Raw(wire.field_value("guest"))))
    response = wire.shortstr("LOGIN") + Raw(login) + wire.shortstr("PASSWORD") + Raw(password)
    chunks = [wire.PROTOCOL_HEADER, wire.start_ok(response, "AMQPLAIN")]
    return dict(chunks=chunks, detail=f"AMQPLAIN LOGIN {bytes(login)[:12]!r} PASSWORD {bytes(password)[:12]!r}")


def amqp_credentials(rng, volume):
    mechanism, response = rng.choice((
        ("PLAIN", "\0guest\0gu€st".encode()), ("PLAIN", "\0gü€st\0guest".encode()),
        ("PLAIN", b"\0\xff\xfe\0\xc3\x28"),
        ("PLAIN", b"\0guest\0guest\0extra"), ("PLAIN", b""), ("PLAIN", b"\0\0"), ("PLAIN", b"\0guest\0" + b"p" * 65536),
        ("AMQPLAIN", wire.shortstr("LOGIN") + wire.field_value("gü€st") + wire.shortstr("PASSWORD")
         + wire.field_value("pä€ss")),
        ("AMQPLAIN", wire.shortstr("LOGIN") + wire.field_value("guest")), ("EXTERNAL", b""), ("€", b"\0guest\0guest"),
    ))
    return dict(chunks=[wire.PROTOCOL_HEADER, wire.start_ok(response, mechanism)],
                detail=f"{mechanism} response {response[:24]!r}")


AMQP_ODD_VALUES = (
    ("timestamp 2**64-1", Raw(b"T" + wire.longlong(2**64 - 1))), ("timestamp 2**63", Raw(b"T" + wire.longlong(2**63))),
    ("decimal scale 255", Raw(b"D" + wire.octet(255) + wire.long_(0xFFFFFFFF))),
    ("decimal scale 200", Raw(b"D" + wire.octet(200) + wire.long_(1))),
    ("float NaN", Raw(b"f" + struct.pack(">f", math.nan))),
    ("double inf", Raw(b"d" + struct.pack(">d", math.inf))), ("uint64 max", Raw(b"L" + wire.longlong(2**64 - 1))),
    ("int8 -128", Raw(b"b\x80")), ("int16 -1", Raw(b"s\xff\xff")), ("unknown type Z", Raw(b"Z\x00\x00")),
    ("long string of invalid UTF-8", Raw(b"S" + wire.longstr(b"\xff\xfe"))),
)


def amqp_out_of_range(rng, volume):
    label, value = rng.choice(AMQP_ODD_VALUES)
    properties = {"headers": {"k": value}, "delivery_mode": rng.choice((2, 2, 0, 3, 255))}
    extra = rng.choice((("timestamp", 2**64 - 1), ("priority", 255), ("expiration", "-1"),
                        ("expiration", "99999999999999999999"), ("expiration", "1e3"), ("expiration", "")))
    properties[extra[0]] = extra[1]
    frames = amqp_login_frames(
        wire.method(1, wire.EXCHANGE_DECLARE, wire.short(0) + wire.shortstr("fuzz-hx") + wire.shortstr("headers")
                    + wire.bits() + wire.table({})),
        wire.method(1, wire.QUEUE_BIND, wire.short(0) + wire.shortstr(SHARED_QUEUE) + wire.shortstr("fuzz-hx")
                    + wire.shortstr("") + wire.bits() + wire.table({"x-match": "any", "k": value})),
        wire.method(1, wire.CONFIRM_SELECT, wire.bits(False)),
        *wire.publish(1, "", b"odd", properties, exchange="fuzz-hx"))
    return dict(login=True, chunks=frames, detail=f"header {label} through a headers exchange, {extra[0]}={extra[1]!r}")


QUEUE_ARGUMENTS = (
    ("x-max-length", -1), ("x-max-length", Raw(b"D" + wire.octet(255) + wire.long_(1))), ("x-message-ttl", -1),
    ("x-message-ttl", 2**63 - 1), ("x-max-priority", 300), ("x-max-priority", -1), ("x-max-priority", 2**40),
    ("x-expires", 0), ("x-overflow", "sideways"), ("x-dead-letter-exchange", "d" * 255), ("x-max-length-bytes", 1.5),
    ("x-single-active-consumer", "yes"), ("x-queue-mode", {"a": [None]}),
    ("x-message-ttl", Raw(b"T" + wire.longlong(2**64 - 1))),
)


def amqp_queue_arguments(rng, volume):
    name, value = rng.choice(QUEUE_ARGUMENTS)
    frames = amqp_login_frames(wire.queue_declare(1, "fuzz-args", exclusive=True, arguments={name: value}),
                               *wire.publish(1, "fuzz-args", b"x", {"priority": 200, "expiration": "10"}),
                               wire.basic_get(1, "fuzz-args"))
    return dict(login=True, chunks=frames, detail=f"queue argument {name}={value!r}")


def amqp_many_channels(rng, volume):
    count = rng.choice((100, 2047, 2048, 4000, 65535))
    frames = [wire.channel_open(number & 0xFFFF) for number in range(1, count + 1)]
    return dict(login=True, chunks=[b"".join(frames)], detail=f"{count} channel.open")


def _body_frames(channel, total, frame_max=131072):
    """Body frames carrying C{total} zero bytes (one frame object, repeated)."""
    payload = frame_max - 8
    full = wire.amqp_frame(wire.FRAME_BODY, channel, bytes(payload))
    frames = [full] * (total // payload)
    if total % payload:
        frames.append(wire.amqp_frame(wire.FRAME_BODY, channel, bytes(total % payload)))
    return frames


def amqp_unfinished_bodies(rng, volume):
    channels = rng.choice((4, 8, 16))
    declared = rng.choice((24 * MiB, 64 * MiB, 1 << 40))
    each = min(declared - 1, volume * OVERSHOOT // channels)
    frames = []
    for channel in range(1, channels + 1):
        frames += [wire.channel_open(channel), wire.publish_method(channel, SHARED_QUEUE),
                   wire.content_header(channel, declared, {"delivery_mode": 2})]
    bodies = [_body_frames(channel, each) for channel in range(1, channels + 1)]
    for row in zip(*bodies):
        frames += row
    return dict(login=True, chunks=frames, send_seconds=HEAVY_SEND_SECONDS,
                detail=f"{channels} channels x {each} bytes of bodies declared {declared} bytes, never finished")


def amqp_tx_uncommitted(rng, volume):
    size = 4 * MiB
    count = volume * OVERSHOOT // size
    frames = amqp_login_frames(wire.queue_declare(1, "fuzz-tx", exclusive=True), wire.method(1, wire.TX_SELECT))
    publish = wire.publish_method(1, "fuzz-tx")
    header = wire.content_header(1, size, {"delivery_mode": 2})
    bodies = _body_frames(1, size)
    for _ in range(count):
        frames += [publish, header, *bodies]
    return dict(login=True, chunks=frames, send_seconds=HEAVY_SEND_SECONDS,
                detail=f"tx.select, {count} publishes of {size} bytes, no commit")


def amqp_get_reject_noread(rng, volume):
    size = min(16 * MiB, volume // 8)
    rounds = volume * OVERSHOOT // size
    frames = amqp_login_frames(wire.queue_declare(1, "fuzz-gr", exclusive=True),
                               wire.publish_method(1, "fuzz-gr"),
                               wire.content_header(1, size), *_body_frames(1, size))
    for tag in range(1, rounds + 1):
        reject = wire.method(1, wire.BASIC_REJECT, wire.longlong(tag) + wire.bits(True))
        frames += [wire.basic_get(1, "fuzz-gr"), reject]
    return dict(login=True, chunks=frames, send_seconds=HEAVY_SEND_SECONDS, read_while_sending=False,
                detail=f"{rounds} x basic.get + reject(requeue) of a {size}-byte message, never reading")


def amqp_preauth_table(rng, volume):
    shape = rng.choice(("voids", "keys", "deep", "big frame"))
    if shape == "voids":
        count = rng.choice((1 << 17, 1 << 20))
        properties = wire.table({"a": Raw(b"A" + wire.long_(count) + b"V" * count)})
    elif shape == "keys":
        count = 50000
        properties = wire.table({f"k{number}": None for number in range(count)})
    elif shape == "deep":
        count = rng.choice((60, 200, 1000))
        properties = wire.table({"a": nested_raw(rng, count)})
    else:
        count = rng.choice((4097, 65536, 1 << 20))
        properties = wire.table({"pad": b"p" * count})
    chunks = [wire.PROTOCOL_HEADER, wire.start_ok(client_properties=properties)]
    return dict(chunks=chunks, detail=f"start-ok client_properties: {shape} ({count})")


def amqp_frame_too_big(rng, volume):
    size = rng.choice((131073, 1 << 20))
    oversized = wire.amqp_frame(wire.FRAME_METHOD, 1, struct.pack(">HH", *wire.BASIC_PUBLISH) + bytes(size))
    frames = amqp_login_frames(oversized)
    return dict(login=True, chunks=frames, detail=f"a {size}-byte method frame over frame_max")


# -- native


def native_frames(*envelopes):
    return [wire.native_frame(item) for item in envelopes]


def native_channel():
    return wire.envelope("channel_open", 1, 1)


def native_deep_arguments(rng, volume):
    depth = rng.randint(20, 60)
    arguments = {"x-a": nested(rng, depth - 1)}
    target = rng.choice(("queue", "exchange", "bind", "consume"))
    if target == "queue":
        requests = [wire.envelope("queue_declare", 1, 2, queue=f"fuzz-deep-n{rng.randrange(4)}", durable=True,
                                  arguments=arguments)]
    elif target == "exchange":
        requests = [wire.envelope("exchange_declare", 1, 2, exchange=f"fuzz-deep-nx{rng.randrange(4)}", type=1,
                                  durable=True, arguments=arguments)]
    elif target == "bind":
        requests = [wire.envelope("queue_bind", 1, 2, queue=SHARED_QUEUE, exchange="amq.direct",
                                  routing_key=f"ndeep{rng.randrange(4)}", arguments=arguments)]
    else:
        requests = [wire.envelope("queue_declare", 1, 2, queue="fuzz-nc", exclusive=True),
                    wire.envelope("basic_consume", 1, 3, queue="fuzz-nc", arguments=arguments)]
    return dict(login=True, chunks=native_frames(native_channel(), *requests),
                detail=f"{target} arguments nested {depth} deep")


def native_publish(properties, exchange="", routing_key=SHARED_QUEUE, body=b"hostile"):
    return [native_channel(), wire.envelope("confirm_select", 1, 2),
            wire.envelope("basic_publish", 1, 0, exchange=exchange, routing_key=routing_key, body=body,
                          properties=properties)]


def native_deep_headers(rng, volume):
    depth = rng.randint(20, 60)
    properties = {"delivery_mode": 2, "headers": {"h": nested(rng, depth - 1)}}
    return dict(login=True, chunks=native_frames(*native_publish(properties)),
                detail=f"persistent message with headers nested {depth} deep")


def native_bad_properties(rng, volume):
    name, fields = rng.choice((
        ("priority 256", dict(priority=256)), ("priority 300", dict(priority=300)),
        ("priority 2**32-1", dict(priority=2**32 - 1)),
        ("300-byte content_type", dict(content_type="c" * 300)), ("256-byte message_id", dict(message_id="m" * 256)),
        ("300-byte header name", dict(headers={"h" * 300: 1})),
        ("header name of 100 euro signs", dict(headers={"€" * 100: 1})),
        ("timestamp -1", dict(timestamp=-1)), ("timestamp 2**63-1", dict(timestamp=2**63 - 1)),
        ("timestamp -2**63", dict(timestamp=-(2**63))), ("delivery_mode 7", dict(delivery_mode=7)),
        ("expiration -5", dict(expiration="-5")), ("expiration abc", dict(expiration="abc")),
        ("300-byte expiration", dict(expiration="1" * 300)), ("user_id not the login", dict(user_id="someone")),
    ))
    properties = {"delivery_mode": 2, **fields}
    routing_key = rng.choice((SHARED_QUEUE, SHARED_QUEUE, "r" * 300))
    return dict(login=True, chunks=native_frames(*native_publish(properties, routing_key=routing_key)),
                detail=f"publish with {name}, routing key of {len(routing_key)} characters")


def _odd_native_values():
    value = messages_pb2.FieldValue
    decimal = messages_pb2.Decimal
    return (
        ("timestamp 2**63-1", value(timestamp_value=2**63 - 1)), ("timestamp -2**63", value(timestamp_value=-(2**63))),
        ("timestamp year 10000", value(timestamp_value=253402300800)),
        ("timestamp year 0", value(timestamp_value=-62135596801)),
        ("decimal scale 2**32-1", value(decimal_value=decimal(scale=2**32 - 1, value=1))),
        ("decimal scale 300", value(decimal_value=decimal(scale=300, value=2**63 - 1))),
        ("decimal value 2**63-1", value(decimal_value=decimal(scale=2, value=2**63 - 1))),
        ("INT8 holding 1000", value(integer_value=1000, integer_kind=messages_pb2.INT8)),
        ("UINT64 holding -1", value(integer_value=-1, integer_kind=messages_pb2.UINT64)),
        ("integer kind 99", value(integer_value=5, integer_kind=99)), ("float NaN", value(float_value=math.nan)),
        ("long-string bytes of invalid UTF-8", value(bytes_value=b"\xff\xfe", long_string_bytes=True)),
        ("70000-byte string", value(string_value="s" * 70000)),
    )


def native_table_values(rng, volume):
    label, odd = rng.choice(_odd_native_values())
    where = rng.choice(("headers exchange", "queue argument"))
    if where == "queue argument":
        name = rng.choice(("x-max-length", "x-message-ttl", "x-max-priority", "x-custom"))
        requests = [native_channel(), wire.envelope("queue_declare", 1, 2, queue="fuzz-nargs", exclusive=True,
                                                     arguments={name: odd})]
        return dict(login=True, chunks=native_frames(*requests), detail=f"queue argument {name} = {label}")
    headers = {"k": odd}
    requests = [native_channel(), wire.envelope("exchange_declare", 1, 3, exchange="fuzz-nhx", type=4),
                wire.envelope("queue_bind", 1, 4, queue=SHARED_QUEUE, exchange="fuzz-nhx",
                              arguments={"x-match": "any", "k": odd}),
                *native_publish({"delivery_mode": 2, "headers": headers}, exchange="fuzz-nhx")[1:]]
    return dict(login=True, chunks=native_frames(*requests), detail=f"header {label} through a headers exchange")


def native_many_channels(rng, volume):
    count = rng.choice((1000, 20000, 100000))
    data = b"".join(wire.native_frame(wire.envelope("channel_open", number, number)) for number in range(1, count + 1))
    return dict(login=True, chunks=[data], detail=f"{count} channel_open")


def native_partial_frame(rng, volume):
    declared = rng.choice((64 * MiB, 128 * MiB, 1 << 31, 0xFFFFFFFF))
    connections = rng.choice((1, 4))
    sent = min(declared - 1, volume * OVERSHOOT // connections) // MiB * MiB
    chunks = [struct.pack(">I", declared), *([bytes(MiB)] * (sent // MiB))]
    return dict(chunks=chunks, send_seconds=HEAVY_SEND_SECONDS, connections=connections,
                detail=f"a frame declaring {declared} bytes, {sent} sent, no hello")


def native_consume_noread(rng, volume):
    size = 4 * MiB
    count = volume * OVERSHOOT // size
    body = bytes(size)
    publish = wire.native_frame(wire.envelope("basic_publish", 1, 0, routing_key="fuzz-ncn", body=body))
    chunks = native_frames(native_channel(), wire.envelope("queue_declare", 1, 2, queue="fuzz-ncn", exclusive=True),
                           wire.envelope("basic_consume", 1, 3, queue="fuzz-ncn", no_ack=True))
    return dict(login=True, chunks=chunks + [publish] * count, send_seconds=HEAVY_SEND_SECONDS,
                read_while_sending=False, detail=f"consume no-ack, {count} publishes of {size} bytes, never reading")


MAKERS = {  # protocol -> [(name, maker, weight)]
    "amqp": [
        ("deep-arguments", amqp_deep_arguments, 3), ("deep-headers", amqp_deep_headers, 3),
        ("long-strings", amqp_long_strings, 3), ("amqplain-typed", amqp_amqplain_typed, 3),
        ("credentials", amqp_credentials, 2), ("out-of-range", amqp_out_of_range, 3),
        ("queue-arguments", amqp_queue_arguments, 2), ("many-channels", amqp_many_channels, 1),
        ("preauth-table", amqp_preauth_table, 2), ("frame-too-big", amqp_frame_too_big, 1),
        ("unfinished-bodies", amqp_unfinished_bodies, 1), ("tx-uncommitted", amqp_tx_uncommitted, 1),
        ("get-reject-noread", amqp_get_reject_noread, 1),
    ],
    "native": [
        ("deep-arguments", native_deep_arguments, 3), ("deep-headers", native_deep_headers, 3),
        ("bad-properties", native_bad_properties, 4), ("table-values", native_table_values, 4),
        ("many-channels", native_many_channels, 1), ("partial-frame", native_partial_frame, 1),
        ("consume-noread", native_consume_noread, 1),
    ],
}


def make(rng, protocol, volume):
    """One structured hostile input for C{protocol}: a dict of L{fuzz.inputs.Input} fields and its name."""
    entries = MAKERS[protocol]
    name, maker, _ = rng.choices(entries, [weight for _, _, weight in entries])[0]
    made = maker(rng, volume)
    made["name"] = name
    return made
