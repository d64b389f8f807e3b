"""``brokerd-native`` (also ``python -m brokerd.native``): a small command line
over the native client, the native protocol's demonstration::

    brokerd-native declare queue jobs --durable
    brokerd-native bind jobs amq.topic --routing-key 'jobs.#'
    brokerd-native bind-exchange audit amq.topic --routing-key 'jobs.#'
    brokerd-native publish --routing-key jobs --persistent --confirm 'hello'
    brokerd-native consume jobs --count 1
    brokerd-native get jobs

The management commands (users, vhosts, permissions, policies, definitions;
L{brokerd.native.admincli}) are deprecated: each first prints one line on
standard error naming the ``brokerd-admin`` command that replaces it, then
does what it did, for one more release.

It logs in as ``--user`` with ``--password`` (defaults: the ``BROKERD_USER`` and
``BROKERD_PASSWORD`` environment variables, else guest/guest, which the broker
admits from loopback only) to ``--vhost`` (default ``/``), or with ``--external``
as the user its TLS client certificate names; a refused login is
one line on standard error with the broker's 403 or 530 and exit status 1.
Over TLS, ``--connect tls:HOST:PORT:trustRoots=CA_DIR`` sends the login only to
a broker whose certificate names HOST; an ``ssl:`` endpoint, which checks no
name, is refused (exit status 1) unless ``--insecure-skip-verify`` says the
risk is taken, and then a warning line is printed.

Bodies are printed one per line to standard output. Exit status: 0 when the
command did what it says; 1 when it did not (the broker refused it, closed the
channel or connection, returned or refused a published message, or could not be
reached; one line on standard error says why, with the broker's reply code and
text); 2 from ``get`` on an empty queue and for a command line that does not parse.
``consume`` stopped by SIGINT or SIGTERM cancels its consumer, closes the
connection and exits 0; another command so stopped exits 1 (it did not finish).
"""

import argparse
import os
import sys

from twisted.internet import defer, task
from twisted.internet.endpoints import clientFromString
from twisted.internet.error import ConnectError

from brokerd.native.admincli import MANAGEMENT_COMMANDS, add_management_commands, deprecation
from brokerd.native.client import (
    DEFAULT_ENDPOINT,
    DEFAULT_PASSWORD,
    DEFAULT_USER,
    BrokerClosed,
    BrokerNotVerified,
    PublishNacked,
    connect,
)
from brokerd.wire.client_endpoints import is_unverified_tls, unverified_problem, unverified_warning
from brokerd.wire.endpoints import endpoint_problem
from brokerd.wire.stop_signals import ignore_further_stop_signals, stop_once_on_signals

# How long a stop signal lets ``consume`` cancel and close before the connection is dropped:
STOP_GRACE_SECONDS = 5


class ConsumerCancelled(Exception):
    """The broker cancelled the consumer (its queue was deleted)."""


def _parse_header(text):
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"header {text!r} is not NAME=VALUE")
    return name, value


PROGRAM = "brokerd-native"


def build_parser(prog=PROGRAM):
    parser = argparse.ArgumentParser(
        prog=prog, description="A small command line over the native client."
    )
    parser.add_argument(
        "--connect", default=DEFAULT_ENDPOINT,
        help=(
            f"broker endpoint (default: {DEFAULT_ENDPOINT}); over TLS"
            " tls:HOST:PORT:trustRoots=CA_DIR, which checks the broker's certificate and name"
        ),
    )
    parser.add_argument(
        "--insecure-skip-verify", action="store_true",
        help=(
            "accept an ssl: --connect endpoint, which does not check the broker's name (nor,"
            " without caCertsDir, its certificate): whoever answers receives the password"
        ),
    )
    parser.add_argument("--vhost", default="/", help="virtual host (default: /)")
    parser.add_argument("--user", default=os.environ.get("BROKERD_USER", DEFAULT_USER),
                        help=f"user to log in as (default: $BROKERD_USER, else {DEFAULT_USER})")
    parser.add_argument(
        "--password", default=os.environ.get("BROKERD_PASSWORD", DEFAULT_PASSWORD),
        help=f"that user's password (default: $BROKERD_PASSWORD, else {DEFAULT_PASSWORD})",
    )
    parser.add_argument(
        "--external", action="store_true",
        help=(
            "log in as the user the TLS client certificate names (SASL EXTERNAL, if the broker"
            " enabled it); give certKey= and privateKey= in --connect"
        ),
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    declare = commands.add_parser("declare", help="declare an exchange or a queue")
    declare.add_argument("kind", choices=["exchange", "queue"])
    declare.add_argument("name", help="name ('' for a server-named queue)")
    declare.add_argument(
        "--type", default="direct", choices=["direct", "fanout", "topic", "headers"]
    )
    declare.add_argument("--durable", action="store_true")
    declare.add_argument("--auto-delete", action="store_true")
    declare.add_argument("--passive", action="store_true", help="only check that it exists")

    delete = commands.add_parser("delete", help="delete an exchange or a queue")
    delete.add_argument("kind", choices=["exchange", "queue"])
    delete.add_argument("name")
    delete.add_argument("--if-unused", action="store_true")
    delete.add_argument("--if-empty", action="store_true", help="queues only")

    bind = commands.add_parser("bind", help="bind a queue to an exchange")
    bind.add_argument("queue")
    bind.add_argument("exchange")
    bind.add_argument("--routing-key", default="")

    unbind = commands.add_parser("unbind", help="remove a binding")
    unbind.add_argument("queue")
    unbind.add_argument("exchange")
    unbind.add_argument("--routing-key", default="")

    bind_exchange = commands.add_parser(
        "bind-exchange",
        help="bind an exchange to another: what SOURCE routes goes on to DESTINATION too",
    )
    bind_exchange.add_argument("destination")
    bind_exchange.add_argument("source")
    bind_exchange.add_argument("--routing-key", default="")

    unbind_exchange = commands.add_parser(
        "unbind-exchange", help="remove an exchange-to-exchange binding"
    )
    unbind_exchange.add_argument("destination")
    unbind_exchange.add_argument("source")
    unbind_exchange.add_argument("--routing-key", default="")

    purge = commands.add_parser("purge", help="drop a queue's ready messages")
    purge.add_argument("queue")

    publish = commands.add_parser(
        "publish", help="publish messages (one per body argument, '-' reads stdin)"
    )
    publish.add_argument("bodies", nargs="+", metavar="BODY")
    publish.add_argument("--exchange", default="")
    publish.add_argument("--routing-key", default="")
    publish.add_argument("--persistent", action="store_true", help="delivery mode 2")
    publish.add_argument("--confirm", action="store_true", help="wait for publisher confirms")
    publish.add_argument(
        "--mandatory", action="store_true", help="fail if no queue takes the message"
    )
    publish.add_argument("--content-type")
    publish.add_argument(
        "--header", action="append", type=_parse_header, default=[], metavar="NAME=VALUE"
    )

    consume = commands.add_parser("consume", help="print messages as they arrive, acking each")
    consume.add_argument("queue")
    consume.add_argument(
        "--count", type=int, default=0, help="stop after this many (default: run until killed)"
    )
    consume.add_argument("--no-ack", action="store_true")
    consume.add_argument("--prefetch", type=int, default=100)

    get = commands.add_parser("get", help="take one message (exit status 2 if the queue is empty)")
    get.add_argument("queue")
    get.add_argument("--requeue", action="store_true", help="put it back instead of acking it")
    add_management_commands(commands)
    return parser


def _write_body(body):
    sys.stdout.buffer.write(body + b"\n")
    sys.stdout.flush()


@defer.inlineCallbacks
def run(reactor, options):
    """Carry out one command; fires with the process exit status."""
    client = yield connect(reactor, options.connect, vhost=options.vhost, client_name="brokerd-cli",
                           username=options.user, password=options.password,
                           mechanism="EXTERNAL" if options.external else "",
                           insecure_skip_verify=options.insecure_skip_verify)
    try:
        channel = yield client.channel()
        status = yield _COMMANDS[options.command](channel, options)
    finally:
        yield client.close()
    # A command fires with its exit status or None: never with a broker reply
    # (which would become the status).
    return status if isinstance(status, int) else 0


@defer.inlineCallbacks
def _declare(channel, options):
    if options.kind == "exchange":
        yield channel.exchange_declare(
            options.name, options.type, options.passive, options.durable, options.auto_delete
        )
        print(options.name)
    else:
        reply = yield channel.queue_declare(
            options.name, options.passive, options.durable, auto_delete=options.auto_delete
        )
        print(f"{reply.queue}\tmessages={reply.message_count}\tconsumers={reply.consumer_count}")


@defer.inlineCallbacks
def _delete(channel, options):
    if options.kind == "exchange":
        yield channel.exchange_delete(options.name, options.if_unused)
    else:
        count = yield channel.queue_delete(options.name, options.if_unused, options.if_empty)
        print(f"messages={count}")


@defer.inlineCallbacks
def _bind(channel, options):
    yield channel.queue_bind(options.queue, options.exchange, options.routing_key)


@defer.inlineCallbacks
def _unbind(channel, options):
    yield channel.queue_unbind(options.queue, options.exchange, options.routing_key)


@defer.inlineCallbacks
def _bind_exchange(channel, options):
    yield channel.exchange_bind(options.destination, options.source, options.routing_key)


@defer.inlineCallbacks
def _unbind_exchange(channel, options):
    yield channel.exchange_unbind(options.destination, options.source, options.routing_key)


@defer.inlineCallbacks
def _purge(channel, options):
    count = yield channel.queue_purge(options.queue)
    print(f"messages={count}")


@defer.inlineCallbacks
def _publish(channel, options):
    properties = {}
    if options.persistent:
        properties["delivery_mode"] = 2
    if options.content_type:
        properties["content_type"] = options.content_type
    if options.header:
        properties["headers"] = dict(options.header)
    returned = []
    channel.on_return = returned.append
    if options.confirm or options.mandatory:
        yield channel.confirm_select()
    confirms = []
    for body in options.bodies:
        data = sys.stdin.buffer.read() if body == "-" else body.encode("utf-8")
        confirms.append(
            channel.basic_publish(
                options.exchange, options.routing_key, data, properties, options.mandatory
            )
        )
    if options.confirm or options.mandatory:
        yield _first_failure_raised(defer.gatherResults(confirms, consumeErrors=True))
    # A publish the broker refuses (e.g. 404 for a missing exchange) closes the
    # channel, and unconfirmed publishes get no answer: closing the channel is
    # the round trip that reports the close, if there was one.
    yield channel.close()
    if returned:
        first = returned[0]
        print(
            f"error: {len(returned)} message(s) returned: {first.reply_code} {first.reply_text}",
            file=sys.stderr,
        )
        return 1
    return 0


def _first_failure_raised(gathered):
    """
    C{gathered} (a gatherResults) failing with its first failure itself rather
    than a FirstError.
    """
    return gathered.addErrback(
        lambda failure: failure.value.subFailure if failure.check(defer.FirstError) else failure
    )


@defer.inlineCallbacks
def _consume(channel, options):
    prefetch = min(options.prefetch, options.count) if options.count else options.prefetch
    yield channel.basic_qos(prefetch)
    finished = defer.Deferred()
    received = 0

    def on_delivery(delivery):
        nonlocal received
        if finished.called:
            return  # left un-acked: the broker requeues it when we close
        _write_body(delivery.body)
        if not options.no_ack:
            delivery.ack()
        received += 1
        if options.count and received >= options.count and not finished.called:
            finished.callback(None)

    def on_cancel(consumer_tag):
        if not finished.called:
            finished.errback(ConsumerCancelled(
                f"the broker cancelled the consumer of queue {options.queue!r}"
                " (the queue was deleted)"
            ))

    channel.on_cancel = on_cancel
    tag = yield channel.basic_consume(options.queue, on_delivery, no_ack=options.no_ack)
    channel.closed.addCallback(lambda reason: finished.called or finished.errback(reason))
    interrupted = getattr(options, "interrupted", None)  # a stop signal: end as --count does
    if interrupted is not None:
        interrupted.addCallback(lambda _: finished.called or finished.callback(None))
    yield finished
    yield channel.basic_cancel(tag)


@defer.inlineCallbacks
def _get(channel, options):
    delivery = yield channel.basic_get(options.queue)
    if delivery is None:
        print(f"queue {options.queue!r} is empty", file=sys.stderr)
        return 2
    _write_body(delivery.body)
    if options.requeue:
        delivery.reject(requeue=True)
    else:
        delivery.ack()
    return 0


_COMMANDS = {
    "declare": _declare,
    "delete": _delete,
    "bind": _bind,
    "unbind": _unbind,
    "bind-exchange": _bind_exchange,
    "unbind-exchange": _unbind_exchange,
    "purge": _purge,
    "publish": _publish,
    "consume": _consume,
    "get": _get,
    **MANAGEMENT_COMMANDS,
}


def main(argv=None, prog=PROGRAM):
    """
    Run one command as C{prog} (the name usage lines and deprecation lines
    give); exits with its status.
    """
    options = build_parser(prog).parse_args(argv)
    if options.command in MANAGEMENT_COMMANDS:
        print(deprecation(prog, options.command), file=sys.stderr, flush=True)
    from twisted.internet import reactor

    problem = endpoint_problem(clientFromString, reactor, options.connect)
    if problem is not None:
        print(
            f"error: --connect: {options.connect!r} is not a valid endpoint: {problem}",
            file=sys.stderr,
        )
        raise SystemExit(1)
    if is_unverified_tls(options.connect):
        if not options.insecure_skip_verify:
            print(f"error: --connect: {unverified_problem(options.connect)}", file=sys.stderr)
            raise SystemExit(1)
        print(unverified_warning(options.connect), file=sys.stderr, flush=True)

    @defer.inlineCallbacks
    def react_main(reactor):
        options.interrupted = defer.Deferred()
        running = run(reactor, options)
        done = defer.Deferred()

        def finished(result):
            if not done.called:
                done.callback(None)
            return result

        running.addBoth(finished)

        def wind_down():
            """SIGINT or SIGTERM stops the reactor: let ``consume`` end cleanly first."""
            if done.called:
                return None
            # A second Ctrl-C would make Twisted's handler fail loudly.
            ignore_further_stop_signals(reactor)
            options.interrupted.callback(None)
            if options.command != "consume":
                return None
            return done.addTimeout(STOP_GRACE_SECONDS, reactor).addErrback(lambda _: None)

        reactor.addSystemEventTrigger("before", "shutdown", wind_down)
        reactor.callWhenRunning(stop_once_on_signals, reactor)
        try:
            status = yield running
        except BrokerNotVerified as problem:
            print(f"error: cannot connect to {options.connect}: {problem}", file=sys.stderr)
            status = 1
        except (BrokerClosed, PublishNacked, ConsumerCancelled) as problem:
            if not options.interrupted.called:
                print(f"error: {problem}", file=sys.stderr)
                status = 1
            elif options.command == "consume":
                # The user stopped it; a connection that did not close in time is no error.
                status = 0
            else:
                print(
                    f"error: stopped by a signal before the {options.command} command finished",
                    file=sys.stderr,
                )
                status = 1
        except ConnectError as problem:
            print(f"error: cannot connect to {options.connect}: {problem}", file=sys.stderr)
            status = 1
        if status:
            raise SystemExit(status)

    task.react(react_main)
