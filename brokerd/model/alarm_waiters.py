"""
Who waits for a resource alarm to clear: the one list the memory watermark and the
disk alarm keep of the publishers they hold back.
"""


class AlarmWaiters:
    """
    Callables waiting for an alarm to clear, in the order they asked; each is called
    once, when the alarm clears, unless forgotten first (its connection closed).
    """

    def __init__(self):
        self._waiting = {}  # callable -> None: a set that keeps its order

    def when_clear(self, blocked, resume):
        """Call C{resume()} once the alarm clears; at once if it is not C{blocked}."""
        if blocked:
            self._waiting[resume] = None
        else:
            resume()

    def forget(self, resume):
        """A connection closed: do not call its C{resume}."""
        self._waiting.pop(resume, None)

    def release(self):
        """The alarm cleared: call every waiter, in the order they asked."""
        waiting, self._waiting = self._waiting, {}
        for resume in waiting:
            resume()
