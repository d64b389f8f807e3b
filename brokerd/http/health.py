"""Health checks in RabbitMQ's shapes: C{/api/health/checks/...},
C{/api/healthchecks/node}, C{/api/aliveness-test}.

A check that passes answers 200 C{{"status": "ok", ...}}; one that fails
answers 503 C{{"status": "failed", "reason": ...}} with what is missing, as
RabbitMQ's C{rabbit_mgmt_wm_health_check_*} do, so load balancers and
Kubernetes probes written for RabbitMQ read brokerd the same way. The alarms
brokerd raises are the memory watermark's (resource C{memory}) and the disk
alarm's (resource C{disk space}), named as RabbitMQ names them.
"""

from brokerd.http.operations import management_channel
from brokerd.http.overview import listeners
from brokerd.http.routes import ApiError, bad_request, not_found
from brokerd.proto import messages_pb2

HEALTH_CHECK_FAILURE_STATUS = 503
ALIVENESS_QUEUE = "aliveness-test"
ALIVENESS_MESSAGE = b"test_message"
PROTOCOL_ALIASES = {
    "amqp091": "amqp", "amqp0.9.1": "amqp", "amqp0-9-1": "amqp", "amqp0_9_1": "amqp",
    "amqps": "amqp/ssl", "https": "https", "http": "http",
}


class HealthCheckFailed(ApiError):
    """A failed check: 503 with RabbitMQ's C{status: failed} body."""

    def __init__(self, reason, **details):
        super().__init__(HEALTH_CHECK_FAILURE_STATUS, "failed", reason)
        self.body = {"status": "failed", "reason": reason, **details}


def _alarms(api):
    context = api.context
    found = []
    if context.broker.watermark.blocked:
        found.append({"resource": "memory", "node": context.node})
    if context.broker.disk_alarm.blocked:
        found.append({"resource": "disk space", "node": context.node})
    return found


def alarms(api):
    """Every alarm in effect (brokerd is one node, so the same as the local alarms)."""
    found = _alarms(api)
    if found:
        raise HealthCheckFailed("There are alarms in effect in the cluster", alarms=found)
    return {"status": "ok"}


def local_alarms(api):
    found = _alarms(api)
    if found:
        raise HealthCheckFailed("There are alarms in effect on the node", alarms=found)
    return {"status": "ok"}


def node(api, name=None):
    """The old node check: passes while the node answers (C{/api/healthchecks/node[/{name}]})."""
    if name is not None and name != api.context.node:
        raise not_found()
    return {"status": "ok"}


def port_listener(api, port):
    try:
        number = int(port)
    except ValueError:
        raise bad_request("Invalid port") from None
    ports = [listener["port"] for listener in listeners(api.context)]
    if number not in ports:
        raise HealthCheckFailed("No active listener", missing=number, ports=ports)
    return {"status": "ok", "port": number}


def protocol_listener(api, protocols):
    """
    Passes if a listener of each protocol of the comma-separated list is active:
    C{protocol} names them (RabbitMQ's names, C{amqp091} is C{amqp}); a failure
    names the C{missing} ones in one string and lists the active C{protocols},
    as RabbitMQ's answers do.
    """
    wanted = [PROTOCOL_ALIASES.get(name.lower(), name.lower()) for name in protocols.split(",")]
    active = sorted({listener["protocol"] for listener in listeners(api.context)})
    missing = [name for name in wanted if name not in active]
    if missing:
        raise HealthCheckFailed("No active listener", missing=",".join(missing), protocols=active)
    return {"status": "ok", "protocol": ",".join(wanted)}


def virtual_hosts(api):
    down = sorted(api.context.broker.unavailable_vhosts)
    if down:
        raise HealthCheckFailed("Some virtual hosts are down", **{"virtual-hosts": down})
    return {"status": "ok"}


def aliveness_test(api, vhost):
    """
    As RabbitMQ 3.x: declare the queue C{aliveness-test} in the vhost, publish
    C{test_message} to it and get it back, through the store, with the user's
    permissions: C{{"status": "ok"}}, or 503 naming what failed.
    """
    with management_channel(api, vhost) as channel:
        channel.queue_declare(ALIVENESS_QUEUE)
        channel.basic_publish(
            "", ALIVENESS_QUEUE, messages_pb2.BasicProperties(), ALIVENESS_MESSAGE
        )
        got = channel.basic_get(ALIVENESS_QUEUE, no_ack=True)
    if got is None or bytes(got[2].body) != ALIVENESS_MESSAGE:
        raise HealthCheckFailed("aliveness test message not received")
    return {"status": "ok"}
