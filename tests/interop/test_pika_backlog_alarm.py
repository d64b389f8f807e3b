"""pika against a real broker: a queue's x-backlog-alarm writes its warning, and the line that clears it, in the
broker's log; a bad threshold closes the channel with 406."""

import re

import pytest
from pika.exceptions import ChannelClosedByBroker

from tests.support.pika_clients import message_count

pytestmark = pytest.mark.usefixtures("watchdog")


def test_the_warning_and_the_line_that_clears_it_reach_the_broker_log(amqp_broker, channel, name):
    queue = name()
    channel.queue_declare(queue, arguments={"x-backlog-alarm": 2})
    for number in range(3):
        channel.basic_publish("", queue, b"%d" % number)
    assert message_count(channel, queue) == 3  # a round trip: the broker has handled the publishes
    warning = amqp_broker.process.wait_for_output(re.escape(f"queue '{queue}' in vhost '/' has 3 messages ready,"
                                                            " above its backlog alarm of 2"))
    assert "#warn]" in warning
    channel.basic_get(queue, auto_ack=True)
    amqp_broker.process.wait_for_output(re.escape(f"queue '{queue}' in vhost '/' has 2 messages ready, no longer"
                                                  " above its backlog alarm of 2"))


def test_a_negative_threshold_closes_the_channel_with_406(channel, name):
    queue = name()
    with pytest.raises(ChannelClosedByBroker) as closed:
        channel.queue_declare(queue, arguments={"x-backlog-alarm": -1})
    assert closed.value.reply_code == 406
    assert closed.value.reply_text == (f"PRECONDITION_FAILED - invalid arg 'x-backlog-alarm' for queue '{queue}' in"
                                       " vhost '/': -1 is outside at least 0")
