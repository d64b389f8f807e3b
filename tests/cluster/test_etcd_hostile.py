"""Answers no etcd gives, from a small HTTP server of the test's own: each refused with an error
naming the problem, and no more read than the bound allows, however much the server sends."""

from twisted.internet import defer, reactor
from twisted.trial import unittest
from twisted.web import resource, server

from brokerd.cluster import etcd
from brokerd.cluster.errors import EtcdRefused, EtcdUnavailable, MalformedResponse
from brokerd.cluster.watch import KeyWatch
from tests.support.broker import wait_until

CHUNK = b"x" * 65536
SERVER_CAP = 64 * 1024 * 1024  # the server gives up by itself past this, should the client never stop it


class Endless:
    """Writes C{CHUNK} (or C{chunk}) to a request on every turn of the reactor until the client goes."""

    def __init__(self, request, chunk=CHUNK, first=b""):
        self.sent = 0
        self._request, self._chunk = request, chunk
        self._gone = False
        request.notifyFinish().addBoth(self._lost)
        if first:
            request.write(first)
        self._more()

    def _lost(self, _):
        self._gone = True

    def _more(self):
        if self._gone:
            return
        if self.sent > SERVER_CAP:
            self._request.finish()
            return
        self._request.write(self._chunk)
        self.sent += len(self._chunk)
        reactor.callLater(0, self._more)


class Hostile(resource.Resource):
    """Answers every POST as C{self.answer} says: bytes to send, or a function of the request."""

    isLeaf = True

    def __init__(self):
        super().__init__()
        self.answer = b"{}"
        self.status = 200
        self.streams = []

    def render_POST(self, request):
        request.setResponseCode(self.status)
        if callable(self.answer):
            self.streams.append(self.answer(request))
            return server.NOT_DONE_YET
        return self.answer


class HostileServerTests(unittest.TestCase):
    def setUp(self):
        self.hostile = Hostile()
        port = reactor.listenTCP(0, server.Site(self.hostile), interface="127.0.0.1")
        self.addCleanup(port.stopListening)
        self.client = etcd.EtcdClient(reactor, f"http://127.0.0.1:{port.getHost().port}", timeout=3.0,
                                      max_answer=256 * 1024)

    @defer.inlineCallbacks
    def refused(self, answer, error, words, call=None):
        self.hostile.answer = answer
        with self.assertRaises(error) as raised:
            yield (call or (lambda: self.client.range(b"/k")))()
        for word in words:
            self.assertIn(word, str(raised.exception))
        return raised.exception

    @defer.inlineCallbacks
    def test_an_endless_answer_is_cut_at_the_bound(self):
        yield self.refused(Endless, MalformedResponse, ["over the 262144 bytes"])
        yield wait_until(lambda: self.hostile.streams[0]._gone)
        # The client stopped reading: the server could not push more than the socket buffers hold.
        self.assertLess(self.hostile.streams[0].sent, 16 * 1024 * 1024)

    @defer.inlineCallbacks
    def test_a_declared_length_over_the_bound_is_refused_before_reading(self):
        def huge(request):
            request.setHeader(b"content-length", b"1000000000")
            request.write(b"{")
            return request

        yield self.refused(huge, MalformedResponse, ["declares 1000000000 bytes"])

    @defer.inlineCallbacks
    def test_not_json_is_refused_showing_its_start(self):
        yield self.refused(b"<html>gateway</html>", MalformedResponse, ["not JSON", "<html>"])

    @defer.inlineCallbacks
    def test_json_that_is_not_an_object_is_refused(self):
        yield self.refused(b"[1, 2]", MalformedResponse, ["expected a JSON object", "list"])

    @defer.inlineCallbacks
    def test_wrong_types_are_refused_naming_the_field(self):
        yield self.refused(b'{"kvs": "nope"}', MalformedResponse, ["'kvs'", "not a list"])
        yield self.refused(b'{"kvs": [{"key": "L2E=", "mod_revision": "12x"}]}', MalformedResponse,
                           ["'mod_revision'", "not an integer"])
        yield self.refused(b'{"kvs": [{"key": "L2E=", "version": true}]}', MalformedResponse,
                           ["'version'", "not an integer"])
        yield self.refused(b'{"header": {"revision": "99999999999999999999"}}', MalformedResponse,
                           ["'revision'"])
        yield self.refused(b'{"header": []}', MalformedResponse, ["'header'", "list"])

    @defer.inlineCallbacks
    def test_bad_base64_is_refused_naming_the_field(self):
        yield self.refused(b'{"kvs": [{"key": "!!not base64!!"}]}', MalformedResponse, ["'key'", "base64"])

    @defer.inlineCallbacks
    def test_a_transaction_answer_that_does_not_match_its_operations_is_refused(self):
        yield self.refused(b'{"succeeded": true, "responses": []}', MalformedResponse, ["0 responses for 1"],
                           lambda: self.client.txn([etcd.key_absent(b"/k")], [etcd.put_request(b"/k", b"v")]))
        yield self.refused(b'{"succeeded": "yes"}', MalformedResponse, ["'succeeded'", "not a boolean"],
                           lambda: self.client.txn([], []))

    @defer.inlineCallbacks
    def test_a_keepalive_answer_about_another_lease_is_refused(self):
        yield self.refused(b'{"result": {"ID": "8", "TTL": "10"}}', MalformedResponse, ["not about lease 7"],
                           lambda: self.client.lease_keepalive(7))

    @defer.inlineCallbacks
    def test_an_error_status_is_a_refusal_with_the_message_cut_short(self):
        self.hostile.status = 503
        error = yield self.refused(b'{"code": 14, "message": "' + b"m" * 5000 + b'"}', EtcdRefused, ["HTTP 503"])
        self.assertEqual(error.code, 14)
        self.assertLess(len(str(error)), 400)

    @defer.inlineCallbacks
    def test_an_error_status_from_something_else_than_etcd_is_a_refusal_showing_its_start(self):
        self.hostile.status = 404
        error = yield self.refused(b"404 page not found\n" + b"x" * 5000, EtcdRefused, ["HTTP 404", "page not found"])
        self.assertEqual(error.code, 0)
        self.assertLess(len(str(error)), 300)

    @defer.inlineCallbacks
    def test_a_server_that_never_answers_times_out(self):
        yield self.refused(lambda request: request, EtcdUnavailable, ["did not answer within 3.0 s"])

    @defer.inlineCallbacks
    def test_a_watch_line_without_end_is_cut_at_the_bound_and_the_watch_tries_again(self):
        opened = []

        def answer(request):
            if request.path == b"/v3/kv/range":
                request.write(b'{"header": {"revision": "5"}}')
                request.finish()
                return None
            opened.append(request)
            return Endless(request, chunk=b"{" * 65536)

        self.hostile.answer = answer
        snapshots = []
        watch = KeyWatch(self.client, reactor, b"/k", lambda kvs, revision: snapshots.append(revision),
                         lambda events: self.fail("no event was sent"), retry_seconds=0.05, max_line=128 * 1024)
        self.addCleanup(watch.stop)
        yield watch.start()
        self.assertEqual(snapshots, [5])
        yield wait_until(lambda: len(opened) >= 2)
        streams = [stream for stream in self.hostile.streams if stream is not None]
        yield wait_until(lambda: streams[0]._gone)
        self.assertLess(streams[0].sent, 16 * 1024 * 1024)

    @defer.inlineCallbacks
    def test_watch_lines_of_the_wrong_shape_end_the_stream_and_deliver_nothing(self):
        opened = []

        def answer(request):
            if request.path == b"/v3/kv/range":
                request.write(b'{"header": {"revision": "5"}}')
                request.finish()
                return None
            opened.append(request)
            lines = [b'{"result": {"created": true}}', b'{"result": {"events": [{"type": "MOVE", "kv": {}}]}}',
                     b'{"result": {"events": "x"}}', b"not json", b'{"error": {"message": "' + b"e" * 3000 + b'"}}']
            request.write(lines[min(len(opened) - 1, len(lines) - 1)] + b"\n")
            request.finish()
            return None

        self.hostile.answer = answer
        events = []
        watch = KeyWatch(self.client, reactor, b"/k", lambda kvs, revision: None, events.append, retry_seconds=0.02)
        self.addCleanup(watch.stop)
        yield watch.start()
        yield wait_until(lambda: len(opened) >= 6)
        self.assertEqual(events, [])
        self.assertEqual(watch.revision, 5)
