"""Vhost and user limits enforced, with RabbitMQ's codes and texts, for every protocol.

L{ClientLimits} answers the protocol servers: a connection to a vhost at its
C{max-connections} (530, checked before the user's permissions, as RabbitMQ's
C{rabbit_reader} does), a connection of a user at its C{max-connections}
(530), a channel of a user at its C{max-channels} across all its connections
(530: RabbitMQ closes the connection). Open connections and channels are
counted when a limit applies, never otherwise. A vhost's C{max-queues} is the
model's to enforce on every declare (L{publish_limits} hands it to the running
vhost, as policies are).
"""

from brokerd.access.parameters import effective_limit
from brokerd.errors import NotAllowed

MAX_CONNECTIONS = "max-connections"
MAX_CHANNELS = "max-channels"
MAX_QUEUES = "max-queues"


class ClientLimits:
    """The limits of an access database, checked against the broker's open connections."""

    def __init__(self, access):
        """@param access: the L{brokerd.access.database.AccessDatabase} holding the limits."""
        self.access = access

    def check_connection(self, user, vhost, connections):
        """
        Raise L{NotAllowed} if C{vhost} or C{user} is at its C{max-connections}
        among C{connections} (the broker's open ones).
        """
        limit = effective_limit(self.access.runtime.vhost_limits(vhost), MAX_CONNECTIONS)
        if limit is not None and (
            limit == 0 or sum(1 for c in connections if c.vhost.name == vhost) >= limit
        ):
            raise NotAllowed(
                f"access to vhost '{vhost}' refused for user '{user}':"
                f" connection limit ({limit}) is reached"
            )
        limit = self._user_limit(user, MAX_CONNECTIONS)
        if limit is not None and (
            limit == 0 or sum(1 for c in connections if c.user == user) >= limit
        ):
            raise NotAllowed(
                f"connection refused for user '{user}': user connection limit ({limit}) is reached"
            )

    def check_channel(self, user, connections):
        """Raise L{NotAllowed} if C{user} has C{max-channels} open among C{connections}."""
        limit = self._user_limit(user, MAX_CHANNELS)
        if limit is not None and (
            limit == 0 or sum(len(c.channels) for c in connections if c.user == user) >= limit
        ):
            raise NotAllowed(
                f"number of channels opened for user '{user}' has reached the maximum allowed"
                f" user limit of ({limit})"
            )

    def _user_limit(self, user, name):
        record = self.access.user(user) if user is not None else None
        return effective_limit(record.limits, name) if record is not None else None


def publish_limits(broker, access, vhost_name):
    """
    Tell the running vhost C{vhost_name} its C{max-queues} now (None: no
    limit); a vhost not being served has nothing to tell.
    """
    vhost = broker.vhosts.get(vhost_name)
    if vhost is not None:
        vhost.queue_limit = effective_limit(access.runtime.vhost_limits(vhost_name), MAX_QUEUES)


def publish_all_limits(broker, access):
    """Tell every vhost the broker serves its C{max-queues} (at start, and after an import)."""
    for name in list(broker.vhosts):
        publish_limits(broker, access, name)
