"""Refusals of the HTTP management API's changes in RabbitMQ 3.10.8's words, on a real broker.

RabbitMQ answers three ways, each checked here against what a 3.10.8 node answered the same requests: a declare,
delete, bind or purge (made directly, C{rabbit_mgmt_util:direct_request}) is refused with the bare reason (400), 404
C{not_found} with the reason for a missing end of a binding, and 401 "Access refused." for any refused permission; a
get (on a channel, C{with_channel}) keeps the AMQP reply text ("NOT_FOUND - ...", "405 RESOURCE_LOCKED - ..."); a
publish is refused 400 with the code in front ("404 NOT_FOUND - ...", "403 ACCESS_REFUSED - ...").
"""

import contextlib

import pytest

from tests.support.httpapi import amqp, api, broker  # noqa: F401 (api, broker: the module's fixtures)

ACCESS_REFUSED = (401, {"error": "not_authorised", "reason": "Access refused."})
GET_ONE = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}


def publish_body(routing_key):
    return {"routing_key": routing_key, "payload": "x", "payload_encoding": "string", "properties": {}}


def bad_request(reason):
    return 400, {"error": "bad_request", "reason": reason}


@pytest.fixture(scope="module")
def vhost(api):
    assert api.put("/api/vhosts/refusals", {}) == (201, None)
    assert api.put("/api/permissions/refusals/guest", {"configure": ".*", "write": ".*", "read": ".*"}) == (201, None)
    return "refusals"


def test_a_declare_is_refused_with_the_bare_reason(api, vhost):
    assert api.put("/api/queues/refusals/q", {"durable": True, "arguments": {"x-max-length": 5}}) == (201, None)
    assert api.put("/api/queues/refusals/q", {"durable": True, "arguments": {"x-max-length": 6}}) == bad_request(
        "inequivalent arg 'x-max-length' for queue 'q' in vhost 'refusals': received '6' but current is '5'")
    assert api.put("/api/queues/refusals/q", {"durable": False}) == bad_request(
        "inequivalent arg 'durable' for queue 'q' in vhost 'refusals': received 'false' but current is 'true'")
    assert api.put("/api/queues/refusals/q2", {"arguments": {"x-max-priority": "x"}}) == bad_request(
        "invalid arg 'x-max-priority' for queue 'q2' in vhost 'refusals': \"expected integer, got longstr\"")
    assert api.put("/api/queues/refusals/q3", {"arguments": {"x-max-priority": 300}}) == bad_request(
        "invalid arg 'x-max-priority' for queue 'q3' in vhost 'refusals': {max_value_exceeded,300}")
    assert api.put("/api/exchanges/refusals/e", {"type": "direct"}) == (201, None)
    assert api.put("/api/exchanges/refusals/e", {"type": "fanout"}) == bad_request(
        "inequivalent arg 'type' for exchange 'e' in vhost 'refusals': received 'fanout' but current is 'direct'")


def test_a_queue_beyond_the_vhosts_max_queues_is_refused_with_the_bare_reason(api, vhost):
    assert api.put("/api/vhosts/capped", {}) == (201, None)
    assert api.put("/api/permissions/capped/guest", {"configure": ".*", "write": ".*", "read": ".*"}) == (201, None)
    assert api.put("/api/vhost-limits/capped/max-queues", {"value": 1}) == (204, None)
    assert api.put("/api/queues/capped/first", {}) == (201, None)
    assert api.put("/api/queues/capped/over", {"durable": True}) == bad_request(
        "cannot declare queue 'over': queue limit in vhost 'capped' (1) is reached")
    assert api.delete("/api/vhosts/capped") == (204, None)


def test_a_conditional_delete_is_refused_with_the_bare_reason(api, vhost):
    assert api.put("/api/queues/refusals/full", {}) == (201, None)
    assert api.post("/api/exchanges/refusals/amq.default/publish", publish_body("full")) == (200, {"routed": True})
    assert api.delete("/api/queues/refusals/full?if-empty=true") == bad_request(
        "queue 'full' in vhost 'refusals' not empty")
    assert api.put("/api/exchanges/refusals/used", {"type": "direct"}) == (201, None)
    assert api.post("/api/bindings/refusals/e/used/q/full", {"routing_key": "k"})[0] == 201
    assert api.delete("/api/exchanges/refusals/used?if-unused=true") == bad_request(
        "exchange 'used' in vhost 'refusals' in use")


def test_reserved_names_and_refused_permissions_are_401_access_refused(api, vhost):
    assert api.put("/api/exchanges/refusals/amq.foo", {"type": "direct"}) == ACCESS_REFUSED
    assert api.put("/api/queues/refusals/amq.foo", {}) == ACCESS_REFUSED
    assert api.delete("/api/exchanges/refusals/amq.direct") == ACCESS_REFUSED
    assert api.post("/api/bindings/refusals/e/amq.default/q/q", {"routing_key": "k"}) == ACCESS_REFUSED
    assert api.put("/api/users/refused", {"password": "pw", "tags": "management"}) == (201, None)
    assert api.put("/api/permissions/refusals/refused", {"configure": "^cfg-", "write": "^$", "read": "^$"}) == (
        201, None)
    refused = api.as_user("refused", "pw")
    assert refused.put("/api/queues/refusals/nope", {}) == ACCESS_REFUSED
    assert refused.put("/api/exchanges/refusals/nope", {"type": "direct"}) == ACCESS_REFUSED
    assert refused.delete("/api/queues/refusals/q") == ACCESS_REFUSED
    assert refused.delete("/api/queues/refusals/q/contents") == ACCESS_REFUSED
    assert refused.post("/api/bindings/refusals/e/e/q/q", {"routing_key": "k"}) == ACCESS_REFUSED
    assert refused.post("/api/queues/refusals/q/get", GET_ONE) == (401, {
        "error": "not_authorised",
        "reason": "ACCESS_REFUSED - access to queue 'q' in vhost 'refusals' refused for user 'refused'"})
    assert refused.post("/api/exchanges/refusals/e/publish", publish_body("k")) == bad_request(
        "403 ACCESS_REFUSED - access to exchange 'e' in vhost 'refusals' refused for user 'refused'")


def test_a_missing_end_of_a_binding_is_404_not_found_with_the_reason(api, vhost):
    assert api.post("/api/bindings/refusals/e/nosuch/q/q", {"routing_key": "k"}) == (
        404, {"error": "not_found", "reason": "no exchange 'nosuch' in vhost 'refusals'"})
    assert api.post("/api/bindings/refusals/e/e/q/nosuch", {"routing_key": "k"}) == (
        404, {"error": "not_found", "reason": "no queue 'nosuch' in vhost 'refusals'"})


def test_a_get_keeps_the_amqp_reply_text_and_a_publish_the_code_too(api, broker, vhost):
    assert api.post("/api/queues/refusals/missing/get", GET_ONE) == (
        404, {"error": "not_found", "reason": "NOT_FOUND - no queue 'missing' in vhost 'refusals'"})
    assert api.post("/api/exchanges/refusals/nosuch/publish", publish_body("k")) == bad_request(
        "404 NOT_FOUND - no exchange 'nosuch' in vhost 'refusals'")
    with contextlib.closing(amqp(broker, vhost="refusals")) as connection:
        channel = connection.channel()
        channel.queue_declare("owned", exclusive=True)
        channel.exchange_declare("inside", "direct", internal=True)
        locked = ("cannot obtain exclusive access to locked queue 'owned' in vhost 'refusals'. It could be originally"
                  " declared on another connection or the exclusive property value does not match that of the"
                  " original declaration.")
        assert api.post("/api/queues/refusals/owned/get", GET_ONE) == bad_request(f"405 RESOURCE_LOCKED - {locked}")
        assert api.put("/api/queues/refusals/owned", {"durable": False}) == bad_request(locked)
        assert api.delete("/api/queues/refusals/owned/contents") == bad_request(locked)
        assert api.post("/api/exchanges/refusals/inside/publish", publish_body("k")) == bad_request(
            "403 ACCESS_REFUSED - cannot publish to internal exchange 'inside' in vhost 'refusals'")
