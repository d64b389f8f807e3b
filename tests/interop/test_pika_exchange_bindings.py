"""Exchange-to-exchange bindings (``exchange.bind`` / ``exchange.unbind``) through
pika and a real broker: routing through chains and cycles, cleanup, auto-delete,
alternate exchanges and dead-lettering through them, RabbitMQ 3.10's replies,
the native command line, and durable ones surviving a SIGKILL on every durable
backend."""

import pika
import pytest
from pamqp import commands
from pika import spec

from brokerd.testing import native_cli
from crashloop.loop import DURABLE_BACKENDS, backend_installed
from tests.support.client_broker import raw_client, start_broker
from tests.support.pika_clients import closed_by_broker, get_bodies, pump

pytestmark = pytest.mark.usefixtures("watchdog")


def published(channel, exchange, routing_key, body, **properties):
    """Publishes with mandatory set on a confirming channel; returns whether some queue took it."""
    try:
        channel.basic_publish(exchange, routing_key, body, pika.BasicProperties(**properties), mandatory=True)
    except pika.exceptions.UnroutableError:
        return False
    return True


@pytest.fixture
def confirming(channel):
    channel.confirm_delivery()
    return channel


def test_the_server_offers_exchange_to_exchange_bindings(connection):
    assert connection._impl.server_capabilities["exchange_exchange_bindings"] is True


def test_a_chain_and_a_cycle_deliver_once_to_each_queue(confirming, name):
    channel = confirming
    start, middle, end = name("start"), name("middle"), name("end")
    channel.exchange_declare(start, "topic")
    channel.exchange_declare(middle, "fanout")
    channel.exchange_declare(end, "direct")
    assert isinstance(channel.exchange_bind(middle, start, "orders.#").method, spec.Exchange.BindOk)
    channel.exchange_bind(end, middle, "ignored by fanout")
    channel.exchange_bind(start, end, "orders.new")  # back to the start: a cycle
    channel.exchange_bind(start, start, "#")  # and one onto itself
    queues = {label: channel.queue_declare(name(label)).method.queue for label in ("at_start", "at_end", "twice")}
    channel.queue_bind(queues["at_start"], start, "orders.*")
    channel.queue_bind(queues["at_end"], end, "orders.new")
    channel.queue_bind(queues["twice"], middle)  # reached through middle and through end
    channel.queue_bind(queues["twice"], end, "orders.new")

    assert published(channel, start, "orders.new", b"new")
    assert published(channel, start, "orders.old.archived", b"archived")  # past start only to middle
    assert not published(channel, start, "invoices.new", b"nowhere")

    assert get_bodies(channel, queues["at_start"]) == [b"new"]
    assert get_bodies(channel, queues["at_end"]) == [b"new"]
    assert get_bodies(channel, queues["twice"]) == [b"new", b"archived"]


def test_bind_refusals_and_idempotent_unbind_answer_as_rabbitmq(connection, name):
    channel = connection.channel()
    source, destination = name("source"), name("destination")
    channel.exchange_declare(source, "direct")
    channel.exchange_declare(destination, "fanout")
    refusals = [
        ((destination, "", "k"), 403, "ACCESS_REFUSED - operation not permitted on the default exchange"),
        (("", source, "k"), 403, "ACCESS_REFUSED - operation not permitted on the default exchange"),
        ((destination, "missing-source", "k"), 404, "NOT_FOUND - no exchange 'missing-source' in vhost '/'"),
        (("missing-destination", source, "k"), 404, "NOT_FOUND - no exchange 'missing-destination' in vhost '/'"),
        (("missing-destination", "missing-source", "k"), 404,
         "NOT_FOUND - no exchange 'missing-source' in vhost '/'"),
    ]
    for arguments, code, text in refusals:
        channel = connection.channel()
        error = closed_by_broker(channel.exchange_bind, *arguments)
        assert (error.reply_code, error.reply_text) == (code, text), arguments
    channel = connection.channel()
    error = closed_by_broker(channel.exchange_unbind, "", source, "k")
    assert (error.reply_code, error.reply_text) == (
        403, "ACCESS_REFUSED - operation not permitted on the default exchange")

    channel = connection.channel()
    for arguments in [(destination, "missing-source", "k"), ("missing-destination", source, "k"),
                      (destination, source, "never-bound")]:
        assert isinstance(channel.exchange_unbind(*arguments).method, spec.Exchange.UnbindOk), arguments
    # amq.* and internal exchanges may be either end, and binding twice is one binding.
    internal = name("internal")
    channel.exchange_declare(internal, "fanout", internal=True)
    for arguments in [(destination, "amq.direct", "k"), ("amq.fanout", source, "k"), (internal, source, "k"),
                      (internal, source, "k")]:
        assert isinstance(channel.exchange_bind(*arguments).method, spec.Exchange.BindOk), arguments
    queue = channel.queue_declare(name("q")).method.queue
    channel.queue_bind(queue, internal)
    channel.basic_publish(source, "k", b"through internal")
    channel.exchange_unbind(internal, source, "k")
    channel.basic_publish(source, "k", b"after unbind")
    assert get_bodies(channel, queue) == [b"through internal"]
    headers = name("headers")
    channel.exchange_declare(headers, "headers")
    error = closed_by_broker(channel.exchange_bind, destination, headers, "", {"x-match": "bogus"})
    assert error.reply_code == 406 and "x-match" in error.reply_text


def test_deleting_either_end_removes_the_binding_and_if_unused_counts_only_sources(connection, name):
    channel = connection.channel()
    source, destination, queue = name("source"), name("destination"), name("q")
    channel.exchange_declare(source, "fanout")
    channel.exchange_declare(destination, "fanout")
    channel.exchange_bind(destination, source)
    error = closed_by_broker(channel.exchange_delete, source, if_unused=True)
    in_use = f"PRECONDITION_FAILED - exchange '{source}' in vhost '/' in use"
    assert (error.reply_code, error.reply_text) == (406, in_use)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.exchange_delete(destination, if_unused=True)  # bound only as a destination: unused, as in RabbitMQ
    channel.exchange_delete(source, if_unused=True)  # its binding went with its destination
    channel.exchange_declare(source, "fanout")

    channel.exchange_declare(destination, "fanout")
    channel.queue_declare(queue)
    channel.queue_bind(queue, destination)
    assert not published(channel, source, "", b"the binding went with its destination")
    channel.exchange_bind(destination, source)
    assert published(channel, source, "", b"bound")
    channel.exchange_delete(source)
    channel.exchange_declare(source, "fanout")
    assert not published(channel, source, "", b"the binding went with its source")
    assert get_bodies(channel, queue) == [b"bound"]


def test_an_auto_delete_exchange_goes_with_its_last_binding_as_a_source(connection, name):
    channel = connection.channel()
    unbound, deleted, destination = name("unbound"), name("deleted"), name("destination")
    for exchange in (unbound, deleted, destination):
        channel.exchange_declare(exchange, "fanout", auto_delete=True)
    channel.exchange_bind(destination, unbound)
    channel.exchange_bind(destination, deleted)
    channel.exchange_unbind(destination, unbound)
    channel.exchange_declare(destination, passive=True)  # only ever a destination: stays
    error = closed_by_broker(channel.exchange_declare, unbound, passive=True)
    assert error.reply_code == 404
    channel = connection.channel()
    channel.exchange_delete(destination)
    error = closed_by_broker(channel.exchange_declare, deleted, passive=True)
    assert (error.reply_code, error.reply_text) == (404, f"NOT_FOUND - no exchange '{deleted}' in vhost '/'")


def test_alternate_exchanges_and_dead_letters_route_through_exchange_bindings(confirming, name):
    channel = confirming
    alternate, alternate_onward, routed_onward = name("alternate"), name("alternate-onward"), name("routed-onward")
    entry = name("entry")
    channel.exchange_declare(alternate, "fanout")
    channel.exchange_declare(alternate_onward, "fanout")
    channel.exchange_declare(routed_onward, "direct")
    channel.exchange_declare(entry, "direct", arguments={"alternate-exchange": alternate})
    channel.exchange_bind(alternate_onward, alternate)
    channel.exchange_bind(routed_onward, entry, "to-onward")
    unrouted = channel.queue_declare(name("unrouted")).method.queue
    channel.queue_bind(unrouted, alternate_onward)
    assert published(channel, entry, "no-binding", b"to the alternate")
    # As RabbitMQ: entry routed it (to an exchange), so its alternate is not asked even though
    # routed-onward takes it nowhere.
    assert not published(channel, entry, "to-onward", b"dropped")

    dead_letters, dead_onward = name("dead-letters"), name("dead-onward")
    channel.exchange_declare(dead_letters, "topic")
    channel.exchange_declare(dead_onward, "fanout")
    channel.exchange_bind(dead_onward, dead_letters, "expired.#")
    graveyard = channel.queue_declare(name("graveyard")).method.queue
    channel.queue_bind(graveyard, dead_onward)
    dying = channel.queue_declare(
        name("dying"), arguments={"x-dead-letter-exchange": dead_letters, "x-dead-letter-routing-key": "expired.job"}
    ).method.queue
    channel.basic_publish("", dying, b"rejected")
    method, _, _ = channel.basic_get(dying)
    channel.basic_reject(method.delivery_tag, requeue=False)

    assert get_bodies(channel, unrouted) == [b"to the alternate"]
    pump(channel.connection, lambda: channel.queue_declare(graveyard, passive=True).method.message_count == 1,
         "the dead letter")
    method, properties, body = channel.basic_get(graveyard, auto_ack=True)
    assert body == b"rejected" and properties.headers["x-death"][0]["reason"] == "rejected"


def test_nowait_bind_and_unbind_get_no_reply(amqp_broker, name):
    source, destination = name("source"), name("destination")
    with raw_client(amqp_broker) as client:
        client.open_channel(1)

        def call(method):
            """Sends C{method}; returns the next frame the broker sends, whatever it is."""
            client.send_method(1, method)
            return client.read_frame()[1]

        assert isinstance(call(commands.Exchange.Declare(exchange=source, exchange_type="fanout")),
                          commands.Exchange.DeclareOk)
        assert isinstance(call(commands.Exchange.Declare(exchange=destination, exchange_type="fanout")),
                          commands.Exchange.DeclareOk)
        client.send_method(1, commands.Exchange.Bind(destination=destination, source=source, nowait=True))
        client.send_method(1, commands.Exchange.Unbind(destination=destination, source=source, nowait=True))
        assert isinstance(call(commands.Exchange.Delete(exchange=source)), commands.Exchange.DeleteOk)
        assert isinstance(call(commands.Exchange.Bind(destination=destination, source=destination)),
                          commands.Exchange.BindOk)
        assert isinstance(call(commands.Exchange.Delete(exchange=destination)), commands.Exchange.DeleteOk)


def test_the_command_line_binds_and_unbinds_exchanges(amqp_broker, confirming, name):
    channel = confirming
    source, destination = name("source"), name("destination")
    channel.exchange_declare(source, "direct")
    channel.exchange_declare(destination, "fanout")
    queue = channel.queue_declare(name("q")).method.queue
    channel.queue_bind(queue, destination)
    endpoint = amqp_broker.native_endpoint

    bound = native_cli(endpoint, "bind-exchange", destination, source, "--routing-key", "k")
    assert (bound.returncode, bound.stdout, bound.stderr) == (0, b"", b"")
    assert published(channel, source, "k", b"bound by the command line")
    unbound = native_cli(endpoint, "unbind-exchange", destination, source, "--routing-key", "k")
    assert (unbound.returncode, unbound.stdout, unbound.stderr) == (0, b"", b"")
    assert not published(channel, source, "k", b"unbound")
    refused = native_cli(endpoint, "bind-exchange", destination, name("missing"))
    assert refused.returncode == 1 and b"404 NOT_FOUND - no exchange" in refused.stderr, refused
    assert get_bodies(channel, queue) == [b"bound by the command line"]


LONG_CHAIN = 1500  # exchanges: past what a recursive cascade of deletions reaches


def test_a_long_chain_of_auto_delete_exchanges_goes_with_its_end(amqp_broker, name):
    """Deleting the last of a chain of auto-delete exchanges, each bound to the next, deletes them all
    (each is left with no binding as a source), however long the chain."""
    chain = [name(f"link{number}") for number in range(LONG_CHAIN)]
    with raw_client(amqp_broker) as client:
        client.open_channel(1)
        for source, destination in zip([None, *chain], chain):
            client.send_method(1, commands.Exchange.Declare(exchange=destination, exchange_type="fanout",
                                                            auto_delete=True, nowait=True))
            if source is not None:
                client.send_method(1, commands.Exchange.Bind(destination=destination, source=source, nowait=True))
        client.send_method(1, commands.Exchange.Declare(exchange=chain[0], passive=True))
        client.wait_for(commands.Exchange.DeclareOk)
        client.send_method(1, commands.Exchange.Delete(exchange=chain[-1]))
        client.wait_for(commands.Exchange.DeleteOk)
        client.send_method(1, commands.Exchange.Declare(exchange=chain[0], passive=True))
        client.expect_channel_close(1, 404, chain[0])


def durable_backend(backend):
    return pytest.param(backend, id=backend, marks=pytest.mark.skipif(
        not backend_installed(backend), reason=f"backend {backend!r} is not installed"))


@pytest.mark.parametrize("backend", [durable_backend(backend) for backend in DURABLE_BACKENDS])
def test_durable_exchange_bindings_survive_a_sigkill(backend, tmp_path):
    arguments = ("--backend", backend, "--data-dir", str(tmp_path / "data"))
    broker = start_broker(tmp_path, *arguments)
    try:
        connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        channel = connection.channel()
        channel.confirm_delivery()
        for exchange, kind in [("source", "topic"), ("onward", "headers"), ("transient", "fanout")]:
            channel.exchange_declare(exchange, kind, durable=exchange != "transient")
        channel.queue_declare("kept", durable=True)
        channel.queue_bind("kept", "onward", arguments={"x-match": "any", "kind": "order"})
        channel.exchange_bind("onward", "source", "orders.#", arguments={"x-note": "kept"})
        channel.exchange_bind("onward", "source", "removed.#")
        channel.exchange_unbind("onward", "source", "removed.#")
        channel.exchange_bind("transient", "source", "orders.#")  # one end transient: not kept
        channel.exchange_bind("onward", "transient")
        assert published(channel, "source", "orders.new", b"before", headers={"kind": "order"}, delivery_mode=2)
    finally:
        broker.process.kill()
    broker = start_broker(tmp_path, *arguments)
    try:
        connection = pika.BlockingConnection(pika.URLParameters(broker.amqp_url))
        channel = connection.channel()
        channel.confirm_delivery()
        assert published(channel, "source", "orders.new", b"after", headers={"kind": "order"})
        assert not published(channel, "source", "removed.x", b"unbound", headers={"kind": "order"})
        error = closed_by_broker(channel.exchange_declare, "transient", passive=True)
        assert error.reply_code == 404
        channel = connection.channel()
        assert get_bodies(channel, "kept") == [b"before", b"after"]
        assert any("recovered 2 exchanges, 1 queues (0 unavailable), 2 bindings" in line
                   for line in broker.process.output), broker.process.output
        connection.close()
    finally:
        broker.process.stop()
