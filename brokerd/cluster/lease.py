"""
One etcd lease, kept alive, and the time until which its holder may trust it.

etcd counts a lease's TTL from the moment it handles a keepalive, which is after the node sent
it: so the lease lives at least TTL seconds after the I{sending} of the last keepalive etcd
answered. L{LeaseKeeper} keeps that moment and stops trusting the lease at a fraction of the
TTL after it (2/3 by default, as LavinMQ does), a margin before etcd could expire it and hand
whatever it held (the leader key) to another node. That is the fencing rule: a holder asks
L{LeaseKeeper.valid} before acting as the lease's holder, and that answer is never stale.
"""

from twisted.internet import defer
from twisted.logger import Logger

from brokerd.cluster.errors import EtcdError, LeaseNotFound

DEFAULT_TTL = 10
FENCE_FRACTION = 2 / 3

log = Logger()


class LeaseKeeper:
    """
    Grants a lease of C{ttl} seconds and keeps it alive every C{ttl}/3 seconds, trying again
    sooner when a keepalive fails, until the lease is lost.

    @ivar lease: the L{brokerd.cluster.etcd.Lease} granted (None before L{start} succeeded).
    @ivar keepalives_sent: how many keepalives went out (etcd answered or not).
    @ivar lost: a Deferred firing once, with the reason (a str), when the lease can no longer be
        trusted: its fencing deadline passed without a renewal, etcd said it is gone, or it was
        revoked. It never fires with an error.
    """

    def __init__(self, client, clock, ttl=DEFAULT_TTL, fence_fraction=FENCE_FRACTION):
        if not 0 < fence_fraction < 1:
            raise ValueError("the fencing deadline must come before the lease's TTL runs out")
        if ttl < 2:
            raise ValueError("etcd grants leases of 2 seconds or more")
        self._client, self._clock = client, clock
        self._ttl, self._fraction = ttl, fence_fraction
        self.lease = None
        self.lost = defer.Deferred()
        self._deadline = None
        self._renewal = self._fence = None
        self.keepalives_sent = 0
        self._in_flight = None

    @property
    def keepalive_interval(self):
        return self._ttl / 3

    @property
    def deadline(self):
        """When (on the keeper's clock) the lease stops being trusted unless renewed before."""
        return self._deadline

    @defer.inlineCallbacks
    def start(self):
        """Grants the lease; fires with it, or fails as the etcd client does."""
        sent = self._clock.seconds()
        self.lease = yield self._client.lease_grant(self._ttl)
        self._deadline = sent + self.lease.ttl * self._fraction
        self._arm_fence()
        self._schedule(sent + self.keepalive_interval)
        return self.lease

    def valid(self):
        """Whether the lease may still be trusted now; when its deadline has passed, the lease is
        lost this very moment (C{lost} fires before this returns False)."""
        if self.lost.called or self._deadline is None:
            return False
        now = self._clock.seconds()
        if now >= self._deadline:
            self._lose(f"no keepalive of lease {self.lease.id:x} was answered in time: trusted "
                       f"until {self._deadline:.3f}, now {now:.3f}")
            return False
        return True

    def _schedule(self, when):
        delay = max(0.0, when - self._clock.seconds())
        self._renewal = self._clock.callLater(delay, self._renew)

    @defer.inlineCallbacks
    def _renew(self):
        self._renewal = None
        if not self.valid():
            return
        sent = self._clock.seconds()
        self.keepalives_sent += 1
        in_flight = self._in_flight = self._client.lease_keepalive(self.lease.id,
                                                                   timeout=self._ttl / 6)
        try:
            ttl = yield in_flight
        except defer.CancelledError:
            return  # lost meanwhile
        except LeaseNotFound as error:
            self._lose(f"etcd no longer has lease {self.lease.id:x}: {error}")
            return
        except EtcdError as error:
            if self._in_flight is not in_flight:
                # L{_lose} cancelled it (the client reports that as a failed request) and is
                # giving the lease up: no keepalive is to follow.
                return
            self._in_flight = None
            if not self.lost.called:
                log.warn("keepalive of lease {lease:x} failed: {error}", lease=self.lease.id,
                         error=error)
                self._schedule(self._clock.seconds() + self._ttl / 30)
            return
        self._in_flight = None
        if self.lost.called:
            return
        self._extend(sent + ttl * self._fraction)
        self._schedule(sent + self.keepalive_interval)

    def _extend(self, deadline):
        if deadline <= self._deadline:
            return
        self._deadline = deadline
        self._arm_fence()

    def _arm_fence(self):
        """A timer at the deadline, so the lease is lost then even if nobody asks L{valid}."""
        if self._fence is not None and self._fence.active():
            self._fence.cancel()
        delay = max(0.0, self._deadline - self._clock.seconds())
        self._fence = self._clock.callLater(delay, self._fence_due)

    def _fence_due(self):
        self._fence = None
        if self.valid():
            # A timer may run a hair early (float rounding; the reactor's clock is not this one).
            self._arm_fence()

    def gone(self, reason):
        """Told by another call that etcd no longer has the lease: it is lost now."""
        self._lose(reason)

    def _lose(self, reason):
        for call in (self._renewal, self._fence):
            if call is not None and call.active():
                call.cancel()
        self._renewal = self._fence = None
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            in_flight.cancel()  # its answer would come too late to count
        if not self.lost.called:
            log.warn("lease lost: {reason}", reason=reason)
            self.lost.callback(reason)

    @defer.inlineCallbacks
    def revoke(self):
        """Gives the lease up now (what it held goes at once); an etcd that cannot be reached
        leaves it to expire at its TTL."""
        was_granted = self.lease is not None and not self.lost.called
        self._lose("revoked")
        if was_granted:
            try:
                yield self._client.lease_revoke(self.lease.id)
            except EtcdError as error:
                log.warn("could not revoke lease {lease:x} ({error}): it expires at its TTL",
                         lease=self.lease.id, error=error)
