"""
Following keys in etcd: the gateway's C{/v3/watch} stream (one long response of newline-separated
JSON objects, read through a bounded line buffer) and L{KeyWatch}, which reads the keys first,
then follows their changes from the next revision, resumes from the last revision it saw after a
disconnect, and reads everything again when etcd compacted the history it needed.
"""

import json
from dataclasses import dataclass

from twisted.internet import defer, protocol
from twisted.logger import Logger

from brokerd.cluster import decode
from brokerd.cluster.errors import EtcdError, MalformedResponse
from brokerd.cluster.etcd import key_range

# A watch line holds one batch of events; the cluster's keys are small, so is a batch.
MAX_LINE_BYTES = 1024 * 1024
RETRY_SECONDS = 0.5
# A stream silent this long has its endpoint probed: etcd sends nothing while nothing changes,
# and a partitioned endpoint may never close the connection.
PROBE_SECONDS = 5.0

log = Logger()


@dataclass(frozen=True)
class WatchEvent:
    """A key set (C{deleted} false) or deleted, as a L{decode.KeyValue} (a deleted key's value is
    empty)."""

    deleted: bool
    kv: decode.KeyValue


class WatchLines(protocol.Protocol):
    """
    Splits a watch response into lines of at most C{limit} bytes and hands each, parsed and
    checked, to C{received(result)} (the C{result} object of the line). C{done} fires when the
    response ends, with L{MalformedResponse} when a line was too long, not JSON or not a result.
    """

    def __init__(self, url, received, limit=MAX_LINE_BYTES, status=200):
        self.done = defer.Deferred()
        self._url, self._received, self._limit, self._status = url, received, limit, status
        self._buffer = bytearray()

    def dataReceived(self, data):
        if self.done.called:
            return
        self._buffer += data
        while not self.done.called:
            end = self._buffer.find(b"\n")
            if end < 0:
                if len(self._buffer) > self._limit:
                    self._fail(MalformedResponse(
                        f"etcd at {self._url} sent a watch line longer than {self._limit} bytes"
                    ))
                return
            if end > self._limit:
                self._fail(MalformedResponse(
                    f"etcd at {self._url} sent a watch line longer than {self._limit} bytes"
                ))
                return
            line = bytes(self._buffer[:end])
            del self._buffer[:end + 1]
            if line.strip():
                self._line(line)

    def _line(self, line):
        where = f"watch stream of etcd at {self._url}"
        try:
            if self._status != 200:
                shown = line[:200].decode("utf-8", "replace")
                raise EtcdError(
                    f"etcd at {self._url} refused the watch (HTTP {self._status}): {shown}")
            answer = decode.parse_json_object(line, where)
            if "error" in answer:
                detail = answer["error"]
                detail = detail.get("message") if isinstance(detail, dict) else detail
                raise EtcdError(f"{where} ended with an error: {str(detail)[:200]}")
            self._received(decode.member(answer, "result", where))
        except EtcdError as error:
            self._fail(error)

    def _fail(self, error):
        self.stop()
        if not self.done.called:
            self.done.errback(error)

    def stop(self):
        """Stops reading (the response ends; C{done} fires with None unless it has fired)."""
        if self.transport is not None:
            self.transport.stopProducing()
        if not self.done.called:
            self.done.callback(None)

    def connectionLost(self, reason=protocol.connectionDone):
        if self.done.called:
            return
        if self._status != 200:
            self.done.errback(
                EtcdError(f"etcd at {self._url} refused the watch (HTTP {self._status})"))
        else:
            self.done.callback(None)


class KeyWatch:
    """
    Follows C{key} (every key under it with C{prefix}): C{on_snapshot(kvs, revision)} with every
    key as read at C{revision}, then C{on_events(events)} for each batch of L{WatchEvent}s after
    it, in revision order. After a disconnect it reconnects (the endpoints in turn) and resumes
    after the last revision seen; if etcd compacted that history away, it reads the keys again
    and calls C{on_snapshot} anew. When the stream has been silent for C{probe_seconds}, it asks
    the stream's endpoint for its status, and drops the stream for another endpoint when that
    fails (a silent stream and a dead endpoint look alike otherwise). It stops only at L{stop}.
    """

    def __init__(self, client, clock, key, on_snapshot, on_events, prefix=False,
                 retry_seconds=RETRY_SECONDS, max_line=MAX_LINE_BYTES,
                 probe_seconds=PROBE_SECONDS):
        self._client, self._clock = client, clock
        self._key, self._prefix = key, prefix
        self._on_snapshot, self._on_events = on_snapshot, on_events
        self._retry_seconds, self._max_line = retry_seconds, max_line
        self._probe_seconds = probe_seconds
        self._probe = None  # the delayed call or Deferred of the stream's liveness probe
        self._heard = 0.0  # when the stream last said something
        self.probes_answered = self.probes_failed = 0
        self._next_revision = None  # the first revision not yet delivered; None: read first
        self._pending = None  # the Deferred or delayed call of the current step
        self._lines = None
        self._stopped = False
        self.snapshots = 0  # how many times it read the keys: 1 unless history was compacted
        self._first = None  # the Deferred L{start} gave, until the first snapshot

    def start(self):
        """Starts following; fires once the first snapshot was delivered (until etcd answers, the
        watch keeps trying)."""
        first = defer.Deferred()
        self._first = first
        self._read()
        return first

    def stop(self):
        """Stops following; no callback is called after this."""
        self._stopped = True
        if self._lines is not None:
            self._lines.stop()
        pending, self._pending = self._pending, None
        if isinstance(pending, defer.Deferred):
            pending.cancel()
        elif pending is not None and pending.active():
            pending.cancel()
        self._drop_probe()

    @property
    def revision(self):
        """The last revision delivered (0 before the first snapshot)."""
        return 0 if self._next_revision is None else self._next_revision - 1

    def _read(self):
        self._pending = reading = self._client.range(self._key, self._prefix)
        reading.addCallbacks(self._snapshot, self._retry_later)

    def _snapshot(self, found):
        if self._stopped:
            return
        self.snapshots += 1
        self._next_revision = found.revision + 1
        self._deliver(self._on_snapshot, found.kvs, found.revision)
        self._fire_first()
        self._open()

    def _fire_first(self):
        first, self._first = self._first, None
        if first is not None:
            first.callback(None)

    def _open(self):
        request = {"create_request": dict(key_range(self._key, self._prefix),
                                          start_revision=str(self._next_revision))}
        body = json.dumps(request).encode("utf-8")
        # The timeout bounds the wait for the stream's headers (etcd sends them at once), not
        # the stream.
        self._pending = opening = self._client.gateway.request(b"/v3/watch", body)
        opening.addCallbacks(self._stream, self._retry_later)

    def _stream(self, opened):
        url, response = opened
        lines = WatchLines(url.decode(), self._heard_from, self._max_line, response.code)
        response.deliverBody(lines)
        if self._stopped:
            lines.stop()  # ends the stream the server just opened
            return
        self._lines = lines
        self._pending = lines.done
        lines.done.addCallbacks(self._ended, self._retry_later)
        self._heard = self._clock.seconds()
        self._schedule_probe(url[:-len(b"/v3/watch")], lines, self._probe_seconds)

    def _heard_from(self, result):
        self._heard = self._clock.seconds()
        self._result(result)

    def _schedule_probe(self, endpoint, lines, delay):
        self._probe = self._clock.callLater(delay, self._check_stream, endpoint, lines)

    def _check_stream(self, endpoint, lines):
        """Probes the stream's endpoint if the stream has been silent for C{probe_seconds}."""
        self._probe = None
        if self._stopped or lines is not self._lines:
            return
        silent = self._clock.seconds() - self._heard
        if silent < self._probe_seconds:
            self._schedule_probe(endpoint, lines, self._probe_seconds - silent)
            return
        self._probe = probing = self._client.gateway.post(
            b"/v3/maintenance/status", b"{}", MAX_LINE_BYTES, endpoint=endpoint)

        def alive(_):
            self.probes_answered += 1
            if lines is self._lines:
                self._heard = self._clock.seconds()
                self._schedule_probe(endpoint, lines, self._probe_seconds)

        def dead(failure):
            if failure.check(defer.CancelledError) or lines is not self._lines:
                return
            self.probes_failed += 1
            log.warn("watch of {key!r}: its endpoint does not answer ({error}); reconnecting",
                     key=self._key, error=failure.value)
            lines.stop()

        probing.addCallbacks(alive, dead)

    def _result(self, result):
        where = "watch result"
        compacted = decode.integer(result, "compact_revision", where)
        if compacted:
            log.info("etcd compacted the history past revision {revision}: reading the keys again",
                     revision=self._next_revision)
            self._next_revision = None
            self._lines.stop()
            return
        if decode.boolean(result, "canceled", where):
            reason = decode.text(result, "cancel_reason", where) or "no reason given"
            raise EtcdError(f"etcd cancelled the watch: {reason[:200]}")
        events = []
        for index, item in enumerate(decode.array(result, "events", where)):
            event = decode.json_object(item, f"{where} events[{index}]")
            kind = decode.text(event, "type", f"{where} events[{index}]") or "PUT"
            if kind not in ("PUT", "DELETE"):
                raise MalformedResponse(f"{where}: an event of unknown type {kind[:20]!r}")
            kv = decode.key_value(event.get("kv", {}), f"{where} events[{index}] kv")
            if kv.mod_revision < self._next_revision:
                continue  # already delivered before a reconnect
            events.append(WatchEvent(kind == "DELETE", kv))
        if events:
            self._next_revision = events[-1].kv.mod_revision + 1
            self._deliver(self._on_events, events)

    def _deliver(self, callback, *args):
        """Calls the watcher's own C{callback}; a bug there is logged and does not end the watch."""
        try:
            callback(*args)
        except Exception:
            log.failure("the watcher of {key!r} failed on what it was given", key=self._key)

    def _drop_probe(self):
        probe, self._probe = self._probe, None
        if isinstance(probe, defer.Deferred):
            probe.cancel()
        elif probe is not None and probe.active():
            probe.cancel()

    def _ended(self, _):
        self._lines = None
        self._drop_probe()
        if self._stopped:
            return
        if self._next_revision is None:
            self._read()
        else:
            self._retry_later(EtcdError("etcd ended the watch stream"))

    def _retry_later(self, failure):
        self._lines = None
        self._drop_probe()
        if self._stopped:
            return None
        error = getattr(failure, "value", failure)
        log.warn("watch of {key!r} interrupted ({error}); trying again in {delay} s",
                 key=self._key, error=error, delay=self._retry_seconds)
        step = self._read if self._next_revision is None else self._open
        self._pending = self._clock.callLater(self._retry_seconds, step)
        return None
