"""Connections take turns: a burst of pipelined frames is parsed a slice per reactor turn.

One read of a publishing client can hold hundreds of publishes. Parsing it all
at once keeps every other connection waiting for that long, among them the
consumers whose acks free their prefetch for the next deliveries: under load
a consumer then gets one prefetch's worth per burst, deliveries fall behind
publishing and the backlog (and end-to-end latency) grows for as long as the
load lasts. So a server parses what it read for at most a turn (looking at the
time every L{FRAMES_PER_CHECK} frames) and leaves the rest for the next one,
not reading the socket meanwhile; the reactor serves the other connections in
between. A turn is measured in time, not in frames, because frames differ a
hundredfold in cost. Ending a turn costs a pass of the reactor, so a
connection whose turns find nobody else at work (the pass in between took
little time) gets turns twice as long each time, up to L{LONGEST_TURN}, and
is back to L{TURN_SECONDS} as soon as others are. RabbitMQ gets the same
fairness from Erlang's scheduler and the credit flow between a connection's
reader and its queues.
"""

import time

TURN_SECONDS = 0.0005
LONGEST_TURN = 0.008
FRAMES_PER_CHECK = 16


def turn_clock():
    """
    The time turns are measured in: a monotonic clock, as they share the
    reactor thread's time.
    """
    return time.perf_counter()


def frames_until_check(deadline):
    """After L{FRAMES_PER_CHECK} frames of a turn ending at C{deadline}: how many
    more before the next look at the clock, or 0 if the turn is over."""
    return FRAMES_PER_CHECK if turn_clock() < deadline else 0


class TurnTaking:
    """
    Parses what one connection has left on later turns, one turn's worth at a time.

    @param clock: the C{IReactorTime} whose turns are taken.
    @param pauses: the connection's L{brokerd.wire.backpressure.ReadingPauses};
        its socket is held unread while whole frames wait.
    @param parse_held: parses the frames the connection kept, a turn's worth
        (calling L{end_turn} again if some are left after that).
    """

    __slots__ = ("_clock", "_pauses", "_parse_held", "_call", "_ended_at", "seconds")

    def __init__(self, clock, pauses, parse_held):
        self._clock = clock
        self._pauses = pauses
        self._parse_held = parse_held
        self._call = None
        self._ended_at = 0.0
        self.seconds = TURN_SECONDS  # how long this connection's turns are now

    def deadline(self):
        """When a turn starting now is over, on L{turn_clock}'s scale."""
        return turn_clock() + self.seconds

    def end_turn(self):
        """The connection's turn is over and it keeps whole frames: go on next turn."""
        if self._call is None:
            self._pauses.hold_reading()
            self._ended_at = turn_clock()
            self._call = self._clock.callLater(0, self._next_turn)

    def _next_turn(self):
        self._call = None
        others = turn_clock() - self._ended_at  # what the rest of the pass took
        self.seconds = (
            min(self.seconds * 2, LONGEST_TURN) if others < self.seconds / 2 else TURN_SECONDS
        )
        self._parse_held()
        if self._call is None:  # nothing whole is left: read the socket again
            self._pauses.release_reading()

    def stop(self):
        """The connection is gone: no more turns."""
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
