"""What a leader believes of the header a follower's relay sends before a client's bytes: a header made with the
cluster's secret, for this node, recently and once, names the client; any other, or any byte of it changed, is
refused saying why, and the nonces it remembers to refuse replays are forgotten once their headers are too old."""

import os

import pytest
from twisted.internet.address import IPv4Address, IPv6Address
from twisted.internet.task import Clock

from brokerd.replication.relay_proof import MAX_AGE, MAX_BODY, PROOF_FIELD, RelayHeaderCheck, relay_header
from brokerd.wire import proxy_header
from brokerd.wire.proxy_header import FIXED_SIZE, HeaderRefused

SECRET = os.urandom(32)
CLIENT = IPv4Address("TCP", "203.0.113.7", 40123)
LISTENER = IPv4Address("TCP", "192.0.2.2", 5672)
NOW = 1_700_000_000.0


@pytest.fixture
def clock():
    clock = Clock()
    clock.advance(NOW)
    return clock


@pytest.fixture
def leader(clock):
    return RelayHeaderCheck(SECRET, "a", clock)


def header(now=NOW, secret=SECRET, relayed_by="b", to="a", client=CLIENT, listener=LISTENER):
    return relay_header(secret, relayed_by, to, client, listener, now)


def refusal(leader, made):
    with pytest.raises(HeaderRefused) as refused:
        leader.check(made)
    return str(refused.value)


def test_a_header_made_with_the_clusters_secret_for_this_node_names_the_client(leader):
    assert leader.check(header()) == CLIENT
    client = IPv6Address("TCP", "2001:db8::7", 40123)
    named = leader.check(header(client=client, listener=IPv6Address("TCP", "2001:db8::1", 5672)))
    assert (named.host, named.port) == ("2001:db8::7", 40123)


def test_a_header_made_with_another_secret_is_refused(leader):
    assert "its MAC is not made with this cluster's secret" in refusal(leader, header(secret=os.urandom(32)))
    assert leader.remembered == 0, "a header that failed its MAC takes no memory"


def test_a_header_with_any_byte_changed_is_refused(leader):
    made = header()
    for index in range(len(made)):
        changed = bytearray(made)
        changed[index] ^= 0x01
        with pytest.raises(HeaderRefused):
            leader.check(bytes(changed))
    assert leader.check(made) == CLIENT


def test_a_header_made_for_another_node_is_refused(leader):
    assert "node b made it for node c, not for this node (a)" in refusal(leader, header(to="c"))


def test_a_header_sent_again_is_refused_as_a_replay(leader, clock):
    made = header()
    leader.check(made)
    clock.advance(MAX_AGE / 2)
    assert "it was seen 5.0 s ago: a replay of node b's header" in refusal(leader, made)


def test_a_header_older_than_its_age_limit_or_dated_too_far_ahead_is_refused(leader):
    assert "made it 10.5 s ago, past the 10 s a relay header is good for" in refusal(
        leader, header(now=NOW - MAX_AGE - 0.5))
    assert "made it 10.5 s ahead of this node's clock" in refusal(leader, header(now=NOW + MAX_AGE + 0.5))
    assert leader.check(header(now=NOW - MAX_AGE + 0.5)) == CLIENT


def test_a_header_dated_ahead_stays_remembered_for_as_long_as_it_could_pass(leader, clock):
    ahead = header(now=NOW + MAX_AGE - 1)
    leader.check(ahead)
    clock.advance(MAX_AGE + 5)  # seen more than MAX_AGE ago, yet dated only 6 s ago
    assert "a replay" in refusal(leader, ahead)


def test_nonces_are_forgotten_once_their_headers_are_refused_for_their_age(leader, clock):
    for _ in range(100):
        leader.check(header(now=clock.seconds()))
    assert leader.remembered == 100
    clock.advance(2 * MAX_AGE + 0.1)
    leader.check(header(now=clock.seconds()))
    assert leader.remembered == 1


def test_a_proxy_header_without_a_nodes_proof_last_is_not_believed(leader):
    plain = proxy_header.encode(CLIENT, LISTENER)  # a load balancer's, or a client's own
    assert "without a cluster node's proof as its last field" in refusal(leader, plain)
    made = header()
    body = made[FIXED_SIZE:] + proxy_header.field(0x01, b"h2")  # another field after the proof
    moved = made[:14] + len(body).to_bytes(2, "big") + body
    assert "without a cluster node's proof as its last field" in refusal(leader, moved)
    short = proxy_header.encode(CLIENT, LISTENER, proxy_header.field(PROOF_FIELD, bytes(40)))
    assert "proof of 40 bytes is too short" in refusal(leader, short)


def test_the_longest_header_a_relay_sends_fits_the_cap_its_leader_reads():
    longest = header(relayed_by="b" * 128, to="a" * 128, client=IPv6Address("TCP", "2001:db8::7", 1),
                     listener=IPv6Address("TCP", "2001:db8::1", 2))
    assert len(longest) - FIXED_SIZE <= MAX_BODY
