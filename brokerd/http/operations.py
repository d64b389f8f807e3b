"""A management request's changes made as a client's would be: on a channel, with
the user's permissions.

L{management_channel} opens an in-process L{brokerd.session.connection.Connection}
for the logged-in user on a vhost, with that user's
L{brokerd.access.permissions.ResourceAccess}, so the API's declares,
deletes, binds, publishes and gets are checked exactly as over AMQP (as
RabbitMQ's management plugin opens a direct connection). The connection is
opened and closed within one request, never seen by other requests.
"""

import contextlib

from zope.interface import implementer

from twisted.logger import Logger

from brokerd.errors import AccessRefused, BrokerError, NotAllowed
from brokerd.http.routes import direct_refusal
from brokerd.interfaces import IChannelPeer
from brokerd.session.connection import Connection

log = Logger()


@implementer(IChannelPeer)
class QuietPeer:
    """
    The channel's client side for a management request: nothing is pushed to it
    (no consumers, no confirms).
    """

    def __init__(self):
        self.returned_messages = []

    def deliver(self, consumer_tag, delivery_tag, redelivered, message):
        raise AssertionError("a management channel has no consumers")

    def deliver_run(self, consumer_tag, deliveries):
        raise AssertionError("a management channel has no consumers")

    def returned(self, reply_code, reply_text, message):
        self.returned_messages.append(message)

    def publish_confirmed(self, sequence, multiple, ack):
        pass


@contextlib.contextmanager
def management_channel(api, vhost_name, refusal=direct_refusal):
    """
    A channel of user C{api.user} on vhost C{vhost_name}, closed (with its
    un-acked messages requeued) on leaving; a broker refusal inside becomes
    the HTTP answer C{refusal} makes of it (RabbitMQ answers a declare's, a
    get's and a publish's refusals each in its own way: L{brokerd.http.routes}).
    """
    access = api.resource_access(vhost_name)
    try:
        connection = Connection(
            api.context.broker, vhost_name, "management API", user=api.user, access=access
        )
    except BrokerError as problem:
        raise refusal(problem) from None
    try:
        yield connection.open_channel(1, QuietPeer())
    except BrokerError as problem:
        if isinstance(problem, (AccessRefused, NotAllowed)):  # the answer may not say why
            log.warn("management API request of user '{user}' refused: {problem}",
                     user=api.user, problem=problem.text)
        raise refusal(problem) from None
    finally:
        connection.close()  # its counts stay in the broker's totals
