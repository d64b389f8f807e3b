"""Policies applied to a vhost's queues and exchanges: each key, RabbitMQ's precedence against the objects' own
arguments, priority, apply-to, and policies that change while the objects exist."""

from brokerd.model.policy_effects import Policy, definition_problem
from tests.support.broker import make_broker, open_channel, properties, publish, ready
from tests.support.dead_letters import dead, drain, outcomes, with_dead_letters


def policy(definition, name="p", pattern="^q", priority=0, apply_to="all", vhost="/"):
    return Policy(vhost, name, pattern, definition, priority, apply_to)


def set_policies(broker, *policies):
    broker.vhost("/").set_policies(list(policies))


def queue_of(broker, name="q"):
    return broker.vhost("/").queues[name]


# -- each key


def test_message_ttl_expires_messages(broker, clock):
    set_policies(broker, policy({"message-ttl": 1000}))
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q", b"a")
    clock.advance(1.001)
    assert ready(broker, "q") == 0


def test_expires_deletes_the_unused_queue(broker, clock):
    set_policies(broker, policy({"expires": 2000}))
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    clock.advance(1.9)
    assert "q" in broker.vhost("/").queues
    clock.advance(0.2)
    assert "q" not in broker.vhost("/").queues


def test_max_length_and_dead_letter_exchange_with_its_routing_key(broker):
    channel, _ = open_channel(broker)
    channel.exchange_declare("dlx", "direct")
    channel.queue_declare("dead")
    channel.queue_bind("dead", "dlx", "to-dead")
    set_policies(broker, policy({"max-length": 1, "dead-letter-exchange": "dlx",
                                 "dead-letter-routing-key": "to-dead"}))
    channel.queue_declare("q")
    publish(channel, "q", b"1", b"2")
    assert dead(channel) == [(b"1", "maxlen")]
    assert drain(channel, "q") == [b"2"]


def test_max_length_bytes_drops_the_oldest(broker):
    set_policies(broker, policy({"max-length-bytes": 5}))
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q", b"abc", b"def")
    assert drain(channel, "q") == [b"def"]


def test_overflow_reject_publish_nacks_what_does_not_fit(broker, clock):
    set_policies(broker, policy({"max-length": 1, "overflow": "reject-publish"}))
    channel, peer = open_channel(broker)
    channel.confirm_select()
    channel.queue_declare("q")
    publish(channel, "q", b"1", b"2")
    clock.advance(0)
    assert outcomes(peer) == {1: True, 2: False}
    assert drain(channel, "q") == [b"1"]


def test_delivery_limit_dead_letters_a_message_returned_too_often(broker):
    channel, _ = open_channel(broker)
    set_policies(broker, policy({"delivery-limit": 1, "dead-letter-exchange": "dlx"}))
    with_dead_letters(channel)
    publish(channel, "q", b"m")
    for _ in range(2):
        tag = channel.basic_get("q")[0]
        channel.basic_reject(tag, requeue=True)
    assert ready(broker, "q") == 0
    assert dead(channel) == [(b"m", "delivery_limit")]


def test_alternate_exchange_takes_what_the_exchange_routes_nowhere(broker):
    set_policies(broker, policy({"alternate-exchange": "ae"}, pattern="^main$"))
    channel, _ = open_channel(broker)
    channel.exchange_declare("ae", "fanout")
    channel.queue_declare("q")
    channel.queue_bind("q", "ae")
    channel.exchange_declare("main", "direct")
    channel.basic_publish("main", "nowhere", properties(), b"m")
    assert drain(channel, "q") == [b"m"]
    assert broker.vhost("/").exchanges["main"].applied_policy.name == "p"


# -- precedence


def test_the_lower_of_a_policy_limit_and_the_queue_argument_wins(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q-low-arg", arguments={"x-max-length": 2, "x-message-ttl": 5000})
    channel.queue_declare("q-high-arg", arguments={"x-max-length": 5, "x-message-ttl": 500})
    set_policies(broker, policy({"max-length": 3, "message-ttl": 1000, "expires": 60000, "delivery-limit": 4,
                                 "max-length-bytes": 100}))
    low, high = queue_of(broker, "q-low-arg").policy, queue_of(broker, "q-high-arg").policy
    assert (low.max_length, low.message_ttl) == (2, 1000)
    assert (high.max_length, high.message_ttl) == (3, 500)
    assert (low.expires, low.delivery_limit, low.max_length_bytes) == (60000, 4, 100)


def test_the_queues_own_dead_letter_exchange_and_overflow_win_over_the_policy(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments={"x-dead-letter-exchange": "mine", "x-dead-letter-routing-key": "k",
                                          "x-overflow": "reject-publish"})
    channel.queue_declare("q-plain")
    set_policies(broker, policy({"dead-letter-exchange": "theirs", "dead-letter-routing-key": "pk",
                                 "overflow": "reject-publish-dlx"}))
    mine, plain = queue_of(broker).policy, queue_of(broker, "q-plain").policy
    assert (mine.dead_letter_exchange, mine.dead_letter_routing_key, mine.overflow) == ("mine", "k", "reject-publish")
    assert (plain.dead_letter_exchange, plain.dead_letter_routing_key, plain.overflow) == (
        "theirs", "pk", "reject-publish-dlx")


def test_on_a_quorum_queue_the_policy_wins_for_overflow_and_expires(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", durable=True, arguments={"x-queue-type": "quorum", "x-overflow": "drop-head",
                                                        "x-expires": 1000, "x-max-length": 2})
    set_policies(broker, policy({"overflow": "reject-publish", "expires": 5000, "max-length": 9}))
    settings = queue_of(broker).policy
    assert (settings.overflow, settings.expires, settings.max_length) == ("reject-publish", 5000, 2)


def test_the_exchanges_own_alternate_exchange_wins(broker):
    channel, _ = open_channel(broker)
    channel.exchange_declare("main", "direct", arguments={"alternate-exchange": "mine"})
    set_policies(broker, policy({"alternate-exchange": "theirs"}, pattern="main"))
    assert broker.vhost("/").exchanges["main"].alternate_exchange == "mine"


# -- which policy


def test_the_highest_priority_matching_policy_applies_and_ties_go_to_the_first_name(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    channel.queue_declare("other")
    set_policies(broker, policy({"max-length": 1}, name="low", priority=1),
                 policy({"max-length": 7}, name="high", pattern="q", priority=5),
                 policy({"max-length": 3}, name="b-tie", pattern=".", priority=0),
                 policy({"max-length": 4}, name="a-tie", pattern="r$", priority=0))
    assert queue_of(broker).applied_policy.name == "high"
    assert queue_of(broker).policy.max_length == 7
    assert queue_of(broker, "other").applied_policy.name == "a-tie"


def test_apply_to_limits_a_policy_to_queues_or_exchanges(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    channel.exchange_declare("qx", "direct")
    set_policies(broker, policy({"max-length": 1, "alternate-exchange": "ae"}, name="ex", apply_to="exchanges",
                                priority=9),
                 policy({"max-length": 2, "alternate-exchange": "ae"}, name="qs", apply_to="queues"))
    vhost = broker.vhost("/")
    assert (queue_of(broker).applied_policy.name, queue_of(broker).policy.max_length) == ("qs", 2)
    assert (vhost.exchanges["qx"].applied_policy.name, vhost.exchanges["qx"].alternate_exchange) == ("ex", "ae")
    assert vhost.unapplied_policy_keys(vhost.policies[0]) == ["max-length"]
    assert vhost.unapplied_policy_keys(vhost.policies[1]) == ["alternate-exchange"]


def test_a_key_the_queue_type_does_not_support_keeps_the_whole_policy_off_it(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", durable=True, arguments={"x-queue-type": "quorum"})
    channel.queue_declare("q-classic")
    set_policies(broker, policy({"max-length": 1, "ha-mode": "all"}))
    assert queue_of(broker).applied_policy is None
    assert queue_of(broker, "q-classic").applied_policy.name == "p"


def test_policies_of_other_vhosts_and_bad_patterns_are_left_out(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    set_policies(broker, policy({"max-length": 1}, vhost="other"), policy({"max-length": 2}, name="bad", pattern="("))
    assert queue_of(broker).applied_policy is None
    assert broker.vhost("/").policies == []


def test_unknown_keys_and_invalid_values_are_kept_but_not_applied(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    definition = {"max-length": -1, "message-ttl": "soon", "ha-mode": "all", "queue-mode": "lazy", "expires": 0,
                  "overflow": "explode", "max-length-bytes": 10}
    set_policies(broker, policy(definition))
    vhost = broker.vhost("/")
    assert vhost.policies[0].definition == definition
    assert vhost.unapplied_policy_keys(vhost.policies[0]) == [
        "expires", "ha-mode", "max-length", "message-ttl", "overflow", "queue-mode"]
    settings = queue_of(broker).policy
    assert (settings.max_length, settings.message_ttl, settings.expires, settings.overflow) == (
        None, None, None, "drop-head")
    assert settings.max_length_bytes == 10


# -- policies that change


def test_a_policy_set_after_the_queue_filled_drops_its_overflow_dead_lettered(broker):
    channel, _ = open_channel(broker)
    with_dead_letters(channel)
    publish(channel, "q", b"1", b"2", b"3")
    set_policies(broker, policy({"max-length": 1}))
    assert dead(channel) == [(b"1", "maxlen"), (b"2", "maxlen")]
    assert drain(channel, "q") == [b"3"]


def test_a_new_message_ttl_applies_to_messages_that_come_from_then_on(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q", b"before")
    set_policies(broker, policy({"message-ttl": 100}))
    publish(channel, "q", b"after")
    clock.advance(1)
    assert drain(channel, "q") == [b"before"]


def test_a_cleared_policy_gives_the_queue_its_own_settings_back(broker, clock):
    channel, _ = open_channel(broker)
    channel.queue_declare("q", arguments={"x-max-length": 5})
    own = queue_of(broker).policy
    set_policies(broker, policy({"max-length": 2, "expires": 1000}), policy({"max-length": 1}, name="x", pattern="^x"))
    assert queue_of(broker).policy.max_length == 2
    set_policies(broker, policy({"max-length": 1}, name="x", pattern="^x"))
    assert queue_of(broker).applied_policy is None
    assert queue_of(broker).policy is own
    clock.advance(2)  # the policy's x-expires countdown went with it
    assert "q" in broker.vhost("/").queues
    publish(channel, "q", *[b"m"] * 6)
    assert ready(broker, "q") == 5


def test_a_changed_definition_under_the_same_name_applies(broker):
    channel, _ = open_channel(broker)
    channel.queue_declare("q")
    set_policies(broker, policy({"max-length": 2}))
    set_policies(broker, policy({"max-length": 3}))
    assert queue_of(broker).policy.max_length == 3


def test_queues_and_exchanges_restored_at_start_get_their_policies():
    broker, _ = make_broker()
    channel, _ = open_channel(broker)
    channel.exchange_declare("main", "direct", durable=True)
    channel.queue_declare("q", durable=True)
    restarted, _ = make_broker(broker.store)
    vhost = restarted.vhost("/")
    vhost.set_policies([policy({"max-length": 2}), policy({"alternate-exchange": "ae"}, name="x", pattern="^main$")])
    restarted.recover()
    assert (vhost.queues["q"].applied_policy.name, vhost.queues["q"].policy.max_length) == ("p", 2)
    assert vhost.exchanges["main"].alternate_exchange == "ae"


def test_rabbitmqs_validation_text_for_a_bad_value():
    assert definition_problem({"max-length": 5, "ha-mode": "all", "queue-mode": "whatever"}) is None
    assert definition_problem({"max-length": -1}) == "-1 is not a valid maximum length"
    assert definition_problem({"message-ttl": "soon"}) == '<<"soon">> is not a valid message TTL'
    assert definition_problem({"alternate-exchange": 7}) == "7 is not a valid alternate exchange name"
