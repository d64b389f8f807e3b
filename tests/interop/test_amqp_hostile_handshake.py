"""Hostile AMQP handshakes against a real broker: credentials typed or sized to
take memory, non-ASCII credentials, frames and tables built to stall the
broker, and login guessing; each refused with the reply code that names the
problem while other clients are served."""

import concurrent.futures
import struct
import time

import pytest
from pamqp import commands
from pamqp import encode as pamqp_encode

from tests.support.client_broker import (
    bystander,
    checked_for_tracebacks,
    pika_connection,
    pika_round_trip,
    raw_client,
    start_broker,
    unique_names,
)
from tests.support.rawamqp import FRAME_METHOD, PROTOCOL_HEADER, RawAmqp, raw_frame

pytestmark = pytest.mark.usefixtures("no_broker_tracebacks")

unique = unique_names("amqp-hostile-handshake")

REFUSAL_DELAY = 1.0  # brokerd.access.login.LOGIN_REFUSAL_DELAY, as a client sees it
MAX_TABLE_DEPTH = 24  # brokerd.proto.tables.MAX_TABLE_DEPTH
START_OK = struct.pack(">HH", 10, 11)
QUEUE_DECLARE = struct.pack(">HH", 50, 10)


def short_string(raw):
    return bytes((len(raw),)) + raw


def long_string(raw):
    return struct.pack(">I", len(raw)) + raw


def start_ok_frame(mechanism, response, client_properties=b"\0\0\0\0"):
    """A connection.start-ok frame built by hand: C{response} is any bytes, C{client_properties} an encoded table."""
    payload = START_OK + client_properties + short_string(mechanism.encode()) + long_string(response)
    return raw_frame(FRAME_METHOD, 0, payload + short_string(b"en_US"))


def table_entry(name, tag, value):
    """One field-table entry: its name, a type tag and the value's bytes as given."""
    return short_string(name.encode()) + tag + value


def amqplain(login, password):
    """An AMQPLAIN response (a table's entries without the table's length) for two strings."""
    return pamqp_encode.field_table({"LOGIN": login, "PASSWORD": password})[4:]


def plain(user, password):
    return f"\0{user}\0{password}".encode()


def started(broker):
    """A raw client that sent the protocol header and read connection.start."""
    client = RawAmqp(broker.host, broker.amqp_port)
    client.send(PROTOCOL_HEADER)
    client.wait_for(commands.Connection.Start)
    return client


def refused(broker, *frames, timeout=10):
    """The connection.close a fresh client gets for C{frames} sent after the protocol header."""
    client = started(broker)
    try:
        client.send(b"".join(frames))
        _, close = client.wait_for(commands.Connection.Close, commands.Connection.Tune, timeout=timeout)
        return close
    finally:
        client.close()


def broker_peak_rss(broker):
    """The broker process's peak resident memory (VmHWM), in bytes."""
    with open(f"/proc/{broker.process.process.pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM line in /proc/PID/status")


@pytest.fixture(scope="module")
def users_broker(tmp_path_factory):
    """A broker whose users have non-ASCII passwords (the file is UTF-8, as RabbitMQ's names are)."""
    directory = tmp_path_factory.mktemp("users-broker")
    users = directory / "users"
    users.write_text("alice:päss\nbob:p€ss\n", encoding="utf-8")
    running = start_broker(directory, "--users", str(users))
    with checked_for_tracebacks(running):
        yield running
    running.process.stop()


@pytest.fixture
def fresh_broker(own_broker):
    """A broker of this test alone (its memory and log untouched by others), watched for tracebacks."""
    running = own_broker()
    with checked_for_tracebacks(running):
        yield running


# -- credentials: only strings, lengths checked before memory is taken


GIANT = 2**28
TYPED_LOGINS = {
    "long-long 2^28": (b"l", struct.pack(">q", GIANT), "an integer"),
    "negative int": (b"I", struct.pack(">i", -1), "an integer"),
    "float": (b"d", struct.pack(">d", 1.5), "a floating-point number"),
    "decimal": (b"D", struct.pack(">Bi", 2, 12345), "a decimal"),
    "array": (b"A", struct.pack(">I", 2) + b"VV", "an array"),
    "table": (b"F", struct.pack(">I", 0), "a field table"),
    "timestamp": (b"T", struct.pack(">Q", 0), "a timestamp"),
    "boolean": (b"t", b"\x01", "a boolean"),
}


def test_amqplain_credentials_typed_or_sized_to_take_memory_get_403_and_take_none(fresh_broker):
    before = broker_peak_rss(fresh_broker)
    giant_strings = table_entry("LOGIN", b"S", struct.pack(">I", GIANT) + b"x") + table_entry(
        "PASSWORD", b"S", struct.pack(">I", GIANT) + b"y"
    )
    responses = {"long strings of 2^28 bytes": (giant_strings, "AMQPLAIN response is not a field table")}
    for name, (tag, value, kind) in TYPED_LOGINS.items():
        response = table_entry("LOGIN", tag, value) + table_entry("PASSWORD", tag, value)
        responses[name] = (response, f"AMQPLAIN LOGIN must be a string, not {kind}")

    with concurrent.futures.ThreadPoolExecutor(len(responses)) as pool:
        closes = dict(
            zip(responses, pool.map(lambda item: refused(fresh_broker, start_ok_frame("AMQPLAIN", item[0])),
                                    responses.values()))
        )

    grown = broker_peak_rss(fresh_broker) - before
    assert grown < 8 * 2**20, f"the broker's peak memory grew by {grown / 2**20:.0f} MiB"
    for name, (_, complaint) in responses.items():
        close = closes[name]
        assert isinstance(close, commands.Connection.Close), f"{name}: logged in"
        assert (close.reply_code, name) == (403, name), close.reply_text
        assert complaint in close.reply_text, (name, close.reply_text)
    with pika_connection(fresh_broker) as connection:
        pika_round_trip(connection)


# -- non-ASCII credentials are UTF-8


def test_a_non_ascii_password_from_the_users_file_logs_in_through_plain(users_broker):
    with pika_connection(users_broker, "alice", "päss") as connection:
        pika_round_trip(connection)
    with raw_client(users_broker, response="\0bob\0p€ss") as client:
        client.open_channel(1)
        client.round_trip(1, unique("plain-euro"))


def test_a_non_ascii_password_from_the_users_file_logs_in_through_amqplain(users_broker):
    for user, password in (("alice", "päss"), ("bob", "p€ss")):
        response = amqplain(user, password).decode()  # valid UTF-8: pamqp writes these very bytes
        with raw_client(users_broker, mechanism="AMQPLAIN", response=response) as client:
            client.open_channel(1)
            client.round_trip(1, unique("amqplain-utf8"))


@pytest.mark.parametrize(
    "mechanism, response",
    [
        ("PLAIN", plain("bob", "€uro")),
        ("PLAIN", plain("alice", "pass")),
        ("PLAIN", plain("alice", "päss".encode().decode("latin-1"))),  # the UTF-8 bytes read as Latin-1
        ("PLAIN", b"\0alice\0p\xe4ss"),  # Latin-1, not UTF-8
        ("AMQPLAIN", amqplain("bob", "p€s")),
        ("AMQPLAIN", amqplain("€ve", "p€ss")),
    ],
    ids=["plain-euro", "plain-ascii", "plain-mojibake", "plain-latin1", "amqplain-euro", "amqplain-user"],
)
def test_wrong_non_ascii_credentials_get_403(users_broker, mechanism, response):
    with bystander(users_broker, "alice", "päss"):
        close = refused(users_broker, start_ok_frame(mechanism, response))

        assert isinstance(close, commands.Connection.Close), "logged in with wrong credentials"
        assert close.reply_code == 403, close.reply_text
        assert "ACCESS_REFUSED" in close.reply_text


# -- frames and tables built to stall the broker


def void_array_properties(voids):
    """client_properties holding one array of C{voids} void values."""
    array = b"A" + struct.pack(">I", voids) + b"V" * voids
    entry = short_string(b"x") + array
    return struct.pack(">I", len(entry)) + entry


def test_a_frame_over_4096_bytes_before_tune_ok_closes_the_connection_with_501(fresh_broker):
    padded = pamqp_encode.field_table({"product": "p" * 5000})

    close = refused(fresh_broker, start_ok_frame("PLAIN", plain("guest", "guest"), padded))

    assert isinstance(close, commands.Connection.Close), "a 5 KB frame was read before tune-ok"
    assert close.reply_code == 501, close.reply_text
    assert "FRAME_ERROR" in close.reply_text and "4096" in close.reply_text and "tune-ok" in close.reply_text


def test_start_ok_arrays_of_voids_from_six_strangers_do_not_stall_a_logged_in_client(fresh_broker):
    # The largest start-ok a 128 KiB frame_max allowed before this limit: an array of ~128 Ki voids.
    attack = start_ok_frame("PLAIN", plain("guest", "guest"), void_array_properties(131000))
    assert len(attack) <= 131072
    queue = unique("stall")
    with raw_client(fresh_broker) as client:
        client.timeout = 60  # a stalled broker is measured, not timed out
        client.open_channel(1)
        client.round_trip(1, queue)
        attackers = [started(fresh_broker) for _ in range(6)]
        try:
            for attacker in attackers:
                attacker.send(attack)
            round_trips = []
            for _ in range(5):
                began = time.monotonic()
                client.round_trip(1, queue)
                round_trips.append(time.monotonic() - began)
        finally:
            for attacker in attackers:
                attacker.close()

    assert max(round_trips) < 1.0, f"round trips of a logged-in client took {round_trips} s"


def consume_frame(channel, queue, arguments_table):
    """A basic.consume whose arguments are the encoded table C{arguments_table}."""
    payload = struct.pack(">HH", 60, 20) + b"\0\0" + short_string(queue.encode()) + b"\0" + b"\0" + arguments_table
    return raw_frame(FRAME_METHOD, channel, payload)


def test_arguments_holding_arrays_of_voids_from_logged_in_clients_are_read_in_linear_time(broker):
    queue = unique("linear")
    voids = void_array_properties(130000)
    with raw_client(broker) as client:
        client.timeout = 60  # a stalled broker is measured, not timed out
        client.open_channel(1)
        client.round_trip(1, queue)
        senders = []
        try:
            for _ in range(3):
                sender = RawAmqp(broker.host, broker.amqp_port)
                senders.append(sender)
                sender.handshake()
                sender.open_channel(1)
            for sender in senders:
                sender.send(consume_frame(1, unique("missing"), voids))
            began = time.monotonic()
            client.round_trip(1, queue)
            round_trip = time.monotonic() - began
            for sender in senders:
                sender.expect_channel_close(1, 404, "NOT_FOUND")
        finally:
            for sender in senders:
                sender.close()

    assert round_trip < 1.0, f"a round trip of another client took {round_trip:.2f} s"


def nested_arguments(depth):
    """Queue arguments nested C{depth} levels deep, counting the arguments table itself as 1."""
    value = None
    for _ in range(depth - 1):
        value = {"a": value}
    return {"x-a": value}


def declare_frame(channel, queue, arguments_table):
    """A non-durable queue.declare whose arguments are the encoded table C{arguments_table}."""
    payload = QUEUE_DECLARE + b"\0\0" + short_string(queue.encode()) + b"\x00" + arguments_table
    return raw_frame(FRAME_METHOD, channel, payload)


def deep_arrays(levels):
    """An encoded arguments table {"x-a": [[[...]]]} with C{levels} arrays inside it."""
    inner = b""
    for _ in range(levels):
        inner = b"A" + struct.pack(">I", len(inner)) + inner
    entry = short_string(b"x-a") + inner
    return struct.pack(">I", len(entry)) + entry


def test_queue_arguments_nested_deeper_than_the_limit_close_only_the_channel_with_406(broker):
    queue = unique("deep")
    with bystander(broker), raw_client(broker) as client:
        client.open_channel(1)
        at_limit = pamqp_encode.field_table(nested_arguments(MAX_TABLE_DEPTH))
        client.send(declare_frame(1, queue, at_limit))
        client.wait_for(commands.Queue.DeclareOk)

        too_deep = pamqp_encode.field_table(nested_arguments(MAX_TABLE_DEPTH + 1))
        for channel, table in ((2, too_deep), (3, deep_arrays(3000))):
            client.open_channel(channel)
            client.send(declare_frame(channel, unique("deeper"), table))
            close = client.expect_channel_close(channel, 406, "PRECONDITION_FAILED", "'x-a'", str(MAX_TABLE_DEPTH))
            assert (close.class_id, close.method_id) == (50, 10)

        client.send_method(1, commands.Queue.Delete(queue=queue))
        client.wait_for(commands.Queue.DeleteOk)


def test_a_misplaced_start_ok_is_refused_by_its_place_before_its_table_is_read(broker):
    garbage_table = struct.pack(">I", 6) + short_string(b"k") + b"Z" + b"\0" * 3  # an unknown type tag
    with bystander(broker), raw_client(broker) as client:
        client.send(start_ok_frame("PLAIN", plain("guest", "guest"), garbage_table))

        close = client.expect_connection_close(503, "COMMAND_INVALID", "out of order")

        assert (close.class_id, close.method_id) == (10, 11)


# -- login guessing


def refusal_lines(broker, since):
    return [line for line in broker.process.output[since:] if "refused" in line or "closing AMQP" in line]


def test_failed_logins_are_answered_after_a_delay_and_logged_at_a_bounded_rate(fresh_broker):
    since = len(fresh_broker.process.output)
    with raw_client(fresh_broker) as client:
        client.open_channel(1)
        guesser = started(fresh_broker)
        try:
            guesser.send(start_ok_frame("PLAIN", plain("guest", "guess")))
            sent = time.monotonic()
            client.round_trip(1, unique("while-refusing"))
            served_within = time.monotonic() - sent
            _, close = guesser.wait_for(commands.Connection.Close, commands.Connection.Tune)
            answered_after = time.monotonic() - sent
        finally:
            guesser.close()
        assert close.reply_code == 403, close.reply_text
        assert answered_after >= REFUSAL_DELAY * 0.9, f"refused after {answered_after:.3f} s"
        assert served_within < REFUSAL_DELAY / 2, f"another client waited {served_within:.3f} s for the delay"

        guesses = 40
        with concurrent.futures.ThreadPoolExecutor(guesses) as pool:
            began = time.monotonic()
            closes = list(
                pool.map(lambda n: refused(fresh_broker, start_ok_frame("PLAIN", plain("guest", f"guess{n}"))),
                         range(guesses))
            )
            took = time.monotonic() - began
        assert all(close.reply_code == 403 for close in closes)
        assert took >= REFUSAL_DELAY * 0.9
        client.round_trip(1, unique("after-guessing"))

    lines = refusal_lines(fresh_broker, since)
    assert len(lines) <= 2, "refusals are logged one by one:\n" + "\n".join(lines)
    assert "127.0.0.1" in lines[0] and "ACCESS_REFUSED" in lines[0], lines
