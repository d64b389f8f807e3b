"""A queue that one consumer takes alone hands it what it has room for as one run, which its
channel sends to the client in one go; consumers that share a queue still take it in turns."""

from tests.support.broker import open_channel, publish, ready

SAC = {"x-single-active-consumer": True}


def bodies(peer):
    return [message.body for _, _, _, message in peer.deliveries]


def test_a_lone_consumer_gets_a_backlog_as_runs_within_its_prefetch(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    publish(channel, "q", b"1", b"2", b"3", b"4", b"5")
    channel.basic_qos(3)
    channel.basic_consume("q", "c")
    clock.advance(0)
    assert peer.runs == [("c", [1, 2, 3])]
    assert bodies(peer) == [b"1", b"2", b"3"] and ready(broker, "q") == 2
    channel.basic_ack(2, multiple=True)
    assert peer.runs == [("c", [1, 2, 3]), ("c", [4, 5])]
    assert bodies(peer) == [b"1", b"2", b"3", b"4", b"5"]
    assert channel.consumers["c"].unacked == 3 and ready(broker, "q") == 0


def test_a_message_for_a_waiting_consumer_goes_alone(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    channel.basic_consume("q", "c")
    publish(channel, "q", b"1", b"2")
    assert bodies(peer) == [b"1", b"2"] and peer.runs == []


def test_consumers_that_share_a_queue_take_a_backlog_in_turns(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q")
    channel.basic_qos(2)
    channel.basic_consume("q", "a")
    channel.basic_consume("q", "b")
    channel.flow(False)
    publish(channel, "q", b"1", b"2", b"3", b"4", b"5")
    channel.flow(True)
    clock.advance(0)
    assert [(tag, message.body) for tag, _, _, message in peer.deliveries] == [
        ("a", b"1"), ("b", b"2"), ("a", b"3"), ("b", b"4")]
    assert peer.runs == [] and ready(broker, "q") == 1


def test_the_single_active_consumer_gets_the_runs_and_the_others_nothing(broker, clock):
    channel, peer = open_channel(broker)
    channel.queue_declare("q", arguments=SAC)
    channel.basic_qos(2)
    channel.basic_consume("q", "first")
    channel.basic_consume("q", "second")
    channel.flow(False)
    publish(channel, "q", b"1", b"2", b"3")
    channel.flow(True)
    clock.advance(0)
    assert peer.runs == [("first", [1, 2])] and bodies(peer) == [b"1", b"2"]
    channel.basic_ack(0, multiple=True)
    assert [tag for tag, _, _, _ in peer.deliveries] == ["first"] * 3


def test_a_client_that_stops_reading_stops_a_run_of_a_consumer_without_prefetch(broker, clock):
    channel, peer = open_channel(broker)
    connection = channel.connection
    handed = peer.deliver_run

    def deliver_run(consumer_tag, deliveries):  # as a transport whose write buffer fills up
        handed(consumer_tag, deliveries)
        connection.pause_deliveries()

    peer.deliver_run = deliver_run
    channel.queue_declare("q")
    publish(channel, "q", *[b"x" * 10_000 for _ in range(100)])
    channel.basic_consume("q", "c")  # no prefetch limit
    clock.advance(0)
    (first,) = peer.runs
    assert len(first[1]) == 27  # 256 KiB of bodies and frames, not the whole queue
    assert ready(broker, "q") == 73
    connection.resume_deliveries()
    assert len(peer.runs) == 2 and ready(broker, "q") == 46
