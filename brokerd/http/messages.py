"""C{/api/exchanges/{vhost}/{name}/publish} and
C{/api/queues/{vhost}/{name}/get}: messages over HTTP.

As RabbitMQ's management plugin: a publish answers C{{"routed": bool}}; a get
takes up to C{count} messages and settles them as C{ackmode} says
(C{ack_requeue_true} and C{reject_requeue_true} put them back, marked
redelivered; the C{_false} modes remove them, a reject dead-lettering
them), answering RabbitMQ's list of C{payload}, C{payload_encoding}
(C{string} or C{base64}), C{payload_bytes}, C{redelivered}, C{exchange},
C{routing_key}, C{message_count} and C{properties}. Both run on a
L{brokerd.http.operations.management_channel}, so permissions apply as over AMQP.
"""

import base64

from brokerd.http.operations import management_channel
from brokerd.http.routes import bad_request, channel_refusal, json_body, publish_refusal
from brokerd.proto import messages_pb2
from brokerd.proto.tables import dict_to_table, table_to_dict

ACK_MODES = {
    "ack_requeue_true": ("reject", True),
    "ack_requeue_false": ("ack", None),
    "reject_requeue_true": ("reject", True),
    "reject_requeue_false": ("reject", False),
}
TEXT_PROPERTIES = (
    "content_type", "content_encoding", "correlation_id", "reply_to", "expiration", "message_id",
    "type", "user_id", "app_id",
)
INTEGER_PROPERTIES = ("delivery_mode", "priority", "timestamp")


def build_properties(given):
    """AMQP basic properties from RabbitMQ's JSON C{properties} object."""
    if not isinstance(given, dict):
        raise bad_request("properties must be a JSON object")
    properties = messages_pb2.BasicProperties()
    for name, value in given.items():
        if name in TEXT_PROPERTIES:
            setattr(properties, name, str(value))
        elif name in INTEGER_PROPERTIES:
            try:
                setattr(properties, name, int(value))
            except (TypeError, ValueError):
                raise bad_request(f"property {name} must be a number") from None
        elif name == "headers":
            if not isinstance(value, dict):
                raise bad_request("headers must be a JSON object")
            dict_to_table(value, properties.headers)
        else:
            raise bad_request(f"unknown property {name!r}")
    return properties


def properties_json(properties):
    """The properties a message has set, as RabbitMQ's management API writes them."""
    found = {}
    for field, value in properties.ListFields():
        if field.name in TEXT_PROPERTIES or field.name in INTEGER_PROPERTIES:
            found[field.name] = value
    headers = table_to_dict(properties.headers)
    if headers:
        found["headers"] = headers
    return found


def publish(api, vhost, name):
    body = json_body(api.request)
    missing = [
        key for key in ("routing_key", "payload", "payload_encoding", "properties")
        if key not in body
    ]
    if missing:
        raise bad_request("[" + ",".join("{key_missing," + key + "}" for key in missing) + "]")
    encoding = body["payload_encoding"]
    payload = body["payload"]
    if not isinstance(payload, str) or encoding not in ("string", "base64"):
        raise bad_request("payload_encoding must be string or base64, with a string payload")
    try:
        if encoding == "string":
            raw = payload.encode("utf-8")
        else:
            raw = base64.b64decode(payload, validate=True)
    except ValueError:
        raise bad_request("payload is not valid base64") from None
    api.model_vhost(vhost)
    exchange = "" if name == "amq.default" else name
    with management_channel(api, vhost, publish_refusal) as channel:
        published = channel.messages_published
        channel.basic_publish(
            exchange, str(body["routing_key"]), build_properties(body["properties"]), raw,
            mandatory=True,
        )
        routed = channel.messages_published > published and not channel.peer.returned_messages
    return {"routed": routed}


def get(api, vhost, name):
    body = json_body(api.request)
    try:
        count = int(body.get("count", 1))
    except (TypeError, ValueError):
        raise bad_request("count must be a number") from None
    mode = ACK_MODES.get(body.get("ackmode"))
    if mode is None:
        raise bad_request("ackmode must be one of " + ", ".join(ACK_MODES))
    encoding = body.get("encoding", "auto")
    if encoding not in ("auto", "base64"):
        raise bad_request("encoding must be auto or base64")
    truncate = body.get("truncate")
    api.model_vhost(vhost)
    answers = []
    with management_channel(api, vhost, channel_refusal) as channel:
        for _ in range(max(count, 0)):
            got = channel.basic_get(name, no_ack=mode[0] == "ack")
            if got is None:
                break
            tag, redelivered, message, left = got
            answers.append(_message_json(message, redelivered, left, encoding, truncate))
        if mode[0] == "reject":
            for tag in list(channel.unacked_deliveries):
                channel.basic_reject(tag, requeue=mode[1])
    return answers


def _message_json(message, redelivered, left, encoding, truncate):
    payload = bytes(message.body)
    size = len(payload)
    if truncate is not None:
        try:
            payload = payload[:int(truncate)]
        except (TypeError, ValueError):
            raise bad_request("truncate must be a number") from None
    text = None
    if encoding == "auto":
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError:
            text = None
    return {
        "payload_bytes": size,
        "redelivered": redelivered,
        "exchange": message.exchange,
        "routing_key": message.routing_key,
        "message_count": left,
        "properties": properties_json(message.properties),
        "payload": text if text is not None else base64.b64encode(payload).decode("ascii"),
        "payload_encoding": "string" if text is not None else "base64",
    }
