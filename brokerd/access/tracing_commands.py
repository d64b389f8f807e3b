"""rabbitmqctl's C{trace_on -p VHOST} and C{trace_off -p VHOST}: the firehose of one vhost.

For an administrator; the running vhost's tracing is switched at once
(L{brokerd.model.firehose}). As in RabbitMQ, it is not kept across a restart.
Unlike rabbitmqctl, which accepts any name, an unknown vhost is 404.
"""

from brokerd.access.command_results import DONE, done
from brokerd.errors import NotFound
from brokerd.model.firehose import start_tracing, stop_tracing


def running_vhost(commands, vhost):
    """The running L{brokerd.model.vhost.VirtualHost} called C{vhost}, or 404."""
    served = commands.broker.vhosts.get(vhost)
    if served is None or not commands.access.vhost_exists(vhost):
        raise NotFound(f"Virtual host '{vhost}' does not exist")
    return served


def trace_on(commands, user, vhost):
    """Copy every publish and delivery of C{vhost} to its C{amq.rabbitmq.trace}."""
    commands.check_administrator(user)
    if start_tracing(running_vhost(commands, vhost)):
        return done(user, "Enabling tracing for vhost '{vhost}'", vhost=vhost)
    return DONE


def trace_off(commands, user, vhost):
    """Stop copying C{vhost}'s messages to its C{amq.rabbitmq.trace}."""
    commands.check_administrator(user)
    if stop_tracing(running_vhost(commands, vhost)):
        return done(user, "Disabling tracing for vhost '{vhost}'", vhost=vhost)
    return DONE


def tracing(vhost):
    """Whether tracing is on for C{vhost} (a running vhost, or None: off)."""
    return vhost is not None and vhost.firehose is not None


COMMANDS = {
    "trace_on": (trace_on, 0, 0, "no arguments"),
    "trace_off": (trace_off, 0, 0, "no arguments"),
}
