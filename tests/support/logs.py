"""Watching what the broker logs, for tests that assert a store names what it found."""

from twisted.logger import formatEvent, globalLogPublisher


class LogWatcher:
    """Keeps the text of every log event while a test runs (of one logger's C{namespace}, if
    given)."""

    def __init__(self, testcase, namespace=None):
        self.texts = []
        self._namespace = namespace
        globalLogPublisher.addObserver(self._observe)
        testcase.addCleanup(globalLogPublisher.removeObserver, self._observe)

    def _observe(self, event):
        if self._namespace is None or event.get("log_namespace") == self._namespace:
            self.texts.append(formatEvent(event))

    def matching(self, *words):
        return [text for text in self.texts if all(word in text for word in words)]
