"""What a client sent is fit for one log line: brokerd.wire.connection_log's helpers."""

from brokerd.wire.connection_log import MAX_CLIENT_TEXT, client_text, describe_amqp_client


def test_client_text_keeps_one_line_and_at_most_the_limit():
    assert client_text("pika") == "pika"
    assert client_text("two\nlines\x1b[31m") == "two?lines?[31m"
    long = client_text("y" * 10_000)
    assert long == "y" * MAX_CLIENT_TEXT + "..."


def test_client_text_of_bytes_and_of_what_is_not_text():
    assert client_text(b"caf\xc3\xa9 \xff") == "café \ufffd"
    assert client_text(12) == client_text(None) == client_text({"a": 1}) == ""


def test_amqp_client_description():
    assert describe_amqp_client({"product": "pika", "version": "1.4.4"}) == "pika 1.4.4"
    assert describe_amqp_client({}) == "unnamed client"
    assert (
        describe_amqp_client({"product": "aio-pika", "version": 9, "connection_name": "orders"})
        == "aio-pika, connection name 'orders'"
    )
