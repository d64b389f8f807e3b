"""Watching what the broker logs, for tests that assert a store names what it found."""

from twisted.logger import formatEvent, globalLogPublisher


class LogWatcher:
    """Keeps the text of every log event while a test runs."""

    def __init__(self, testcase):
        self.texts = []
        globalLogPublisher.addObserver(self._observe)
        testcase.addCleanup(globalLogPublisher.removeObserver, self._observe)

    def _observe(self, event):
        self.texts.append(formatEvent(event))

    def matching(self, *words):
        return [text for text in self.texts if all(word in text for word in words)]
