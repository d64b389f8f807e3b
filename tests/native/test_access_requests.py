"""Management requests over the native protocol, through the real client and a
listener on 127.0.0.1 in this process: tables come back whole however many
frames they take, a refusal closes only the request's channel with its code,
and a listener that serves no management refuses them all.

The user a connection logged in as is set on the broker's side of it (the
C{user} of its L{brokerd.session.connection.Connection}), as a login sets it."""

from twisted.internet import defer, reactor
from twisted.trial import unittest

from backends.memory.store import MemoryStore
from brokerd.access.database import AccessDatabase, User
from brokerd.amqp.auth import Authenticator
from brokerd.model.broker import Broker
from brokerd.native.access_requests import REPLY_PART_BYTES, reply_parts
from brokerd.native.admincli import _request
from brokerd.native.cli import build_parser
from brokerd.native.client import ChannelClosed, ConnectionClosed
from brokerd.native.server import NativeServerFactory
from brokerd.proto.native_pb2 import Envelope
from tests.support.broker import connect_client


def listen(testcase, access, serve_management=True):
    """A broker serving a native listener on a free loopback port with C{access}; its endpoint string."""
    store = MemoryStore()
    store.open()
    broker = Broker(store, reactor)
    broker.add_vhost("/")
    factory = NativeServerFactory(broker, authenticator=Authenticator(access))
    if not serve_management:
        factory.management = None
    port = reactor.listenTCP(0, factory, interface="127.0.0.1")
    testcase.addCleanup(port.stopListening)
    testcase.addCleanup(broker.stop)
    return broker, f"tcp:127.0.0.1:{port.getHost().port}"


class NativeManagementTests(unittest.TestCase):
    timeout = 30

    @defer.inlineCallbacks
    def setUp(self):
        self.access = AccessDatabase.in_memory()
        self.broker, endpoint = listen(self, self.access)
        self.client = yield connect_client(self, endpoint)
        self.channel = yield self.client.channel()
        self.log_in_as("guest")

    def log_in_as(self, user, vhost="/"):
        """Make the connection to C{vhost} (there is one) that of C{user}."""
        (connection,) = [connection for connection in self.broker.connections if connection.vhost.name == vhost]
        connection.user = user

    @defer.inlineCallbacks
    def test_a_change_is_answered_once_made_and_a_listing_is_a_table(self):
        self.assertEqual((yield self.channel.management("add_user", ["alice", "pw"])), ((), []))
        self.assertTrue(self.access.check_password("alice", "pw"))
        yield self.channel.management("add_vhost", ["team"])
        self.assertIn("team", self.broker.vhosts)
        yield self.channel.management("set_permissions", ["alice", "^a", "", ".*"], vhost="team")
        self.assertEqual((yield self.channel.management("list_users")),
                         (("user", "tags"), [("alice", "[]"), ("guest", "[administrator]")]))
        self.assertEqual((yield self.channel.management("list_permissions", vhost="team")),
                         (("user", "configure", "write", "read"), [("alice", "^a", "", ".*")]))

    @defer.inlineCallbacks
    def test_a_table_larger_than_a_reply_part_comes_whole_over_several_frames(self):
        names = [f"user-{number:06d}-" + "x" * 200 for number in range(12_000)]  # about 2.6 MB of names
        self.access.users.update((name, User(name, None)) for name in names)
        columns, rows = yield self.channel.management("list_users")
        self.assertEqual(columns, ("user", "tags"))
        self.assertEqual(rows, [("guest", "[administrator]"), *((name, "[]") for name in names)])
        self.assertGreaterEqual(len(reply_parts(columns, rows)), 3)  # it did not fit in one frame
        # The same channel goes on answering after a reply in parts.
        self.assertEqual((yield self.channel.management("list_vhosts")), (("name",), [("/",)]))

    @defer.inlineCallbacks
    def test_a_user_who_is_not_an_administrator_gets_403_on_the_channel_only(self):
        self.access.add_user("bob", "pw", ["monitoring"])
        self.log_in_as("bob")
        refused = yield self.assertFailure(self.channel.management("add_user", ["eve", "pw"]), ChannelClosed)
        self.assertEqual((refused.reply_code, refused.reply_text), (403, "ACCESS_REFUSED - Not administrator user"))
        self.assertIsNone(self.access.user("eve"))
        other = yield self.client.channel()
        self.log_in_as("guest")
        yield other.management("add_user", ["eve", "pw"])
        self.assertIsNotNone(self.access.user("eve"))

    @defer.inlineCallbacks
    def test_refusals_carry_rabbitmqs_codes_and_words(self):
        for command, arguments, code, text in [
            ("add_user", ["guest", "pw"], 406, 'PRECONDITION_FAILED - User "guest" already exists'),
            ("delete_vhost", ["nope"], 404, "NOT_FOUND - Virtual host 'nope' does not exist"),
        ]:
            channel = yield self.client.channel()
            refused = yield self.assertFailure(channel.management(command, arguments), ChannelClosed)
            self.assertEqual((refused.reply_code, refused.reply_text), (code, text))

    @defer.inlineCallbacks
    def test_deleting_the_connections_own_vhost_closes_it_with_320_as_any_other_client(self):
        yield self.channel.management("add_vhost", ["team"])
        self.access.set_permissions("guest", "team", ".*", ".*", ".*")
        endpoint = f"tcp:127.0.0.1:{self.client.transport.getPeer().port}"
        in_team = yield connect_client(self, endpoint, vhost="team")
        channel = yield in_team.channel()
        self.log_in_as("guest", vhost="team")
        closed = yield self.assertFailure(channel.management("delete_vhost", ["team"]), ChannelClosed)
        self.assertEqual((closed.reply_code, closed.reply_text), (320, "CONNECTION_FORCED - vhost 'team' is deleted"))
        self.assertFalse(self.access.vhost_exists("team"))

    @defer.inlineCallbacks
    def test_a_request_on_a_channel_that_is_not_open_closes_the_connection_with_504(self):
        envelope = Envelope(channel=9, correlation_id=1)
        envelope.management_request.command = "list_users"
        self.client.sendFrame(envelope.SerializeToString())
        reason = yield self.client.closed
        self.assertIsInstance(reason, ConnectionClosed)
        self.assertEqual(reason.reply_code, 504)


class WithoutManagementTests(unittest.TestCase):
    timeout = 30

    @defer.inlineCallbacks
    def test_management_requests_are_refused_with_403(self):
        _, endpoint = listen(self, AccessDatabase.in_memory(), serve_management=False)
        client = yield connect_client(self, endpoint)
        channel = yield client.channel()
        refused = yield self.assertFailure(channel.management("list_users"), ChannelClosed)
        self.assertEqual((refused.reply_code, refused.reply_text),
                         (403, "ACCESS_REFUSED - management is not served on this listener"))


class ReplyPartsTests(unittest.TestCase):
    def test_each_part_stays_under_the_part_size_and_only_the_first_has_columns(self):
        rows = [(f"user{number}", "[" + "t" * number + "]") for number in range(2000)]
        parts = reply_parts(("user", "tags"), rows, part_bytes=64 * 1024)
        self.assertGreater(len(parts), 10)
        self.assertEqual([part.more for part in parts], [True] * (len(parts) - 1) + [False])
        self.assertEqual([list(part.columns) for part in parts], [["user", "tags"]] + [[]] * (len(parts) - 1))
        self.assertTrue(all(part.ByteSize() <= 64 * 1024 + 16 for part in parts))
        self.assertEqual([tuple(row.values) for part in parts for row in part.rows], rows)

    def test_a_row_larger_than_a_part_goes_alone_and_a_small_table_is_one_part(self):
        big = ("big", "x" * (REPLY_PART_BYTES + 1))
        parts = reply_parts(("user", "tags"), [("a", "[]"), big, ("b", "[]")])
        self.assertEqual([[tuple(row.values) for row in part.rows] for part in parts], [[("a", "[]")], [big],
                                                                                         [("b", "[]")]])
        (only,) = reply_parts(("name",), [])
        self.assertEqual((list(only.columns), list(only.rows), only.more), (["name"], [], False))


class CommandLineTests(unittest.TestCase):
    """What the management commands of ``python -m brokerd.native`` ask for."""

    def request(self, *argv):
        options = build_parser().parse_args(argv)
        return options.vhost, getattr(options, "permissions_vhost", None), _request(options)

    def test_arguments_go_in_rabbitmqctls_order_and_the_two_vhost_options_stay_apart(self):
        self.assertEqual(self.request("--vhost", "conn", "set-permissions", "--vhost", "team", "bob", "c", "", "r"),
                         ("conn", "team", ["bob", "c", "", "r"]))
        self.assertEqual(self.request("clear-permissions", "-p", "team", "bob"), ("/", "team", ["bob"]))
        self.assertEqual(self.request("list-permissions"), ("/", "/", []))
        self.assertEqual(self.request("set-user-tags", "bob"), ("/", None, ["bob"]))
        self.assertEqual(self.request("set-user-tags", "bob", "administrator", "monitoring"),
                         ("/", None, ["bob", "administrator", "monitoring"]))
        self.assertEqual(self.request("add-user", "bob", "pw"), ("/", None, ["bob", "pw"]))
        self.assertEqual(self.request("change-password", "bob", "pw"), ("/", None, ["bob", "pw"]))
        self.assertEqual(self.request("delete-vhost", "team"), ("/", None, ["team"]))
        self.assertEqual(self.request("list-users"), ("/", None, []))
        self.assertEqual(self.request("delete-user", "bob"), ("/", None, ["bob"]))

    def test_the_managed_user_and_password_are_not_the_options_of_the_login(self):
        options = build_parser().parse_args(["add-user", "alice", "s3cret"])
        self.assertNotIn("alice", vars(options).get("user", "") or "")
        self.assertNotIn("s3cret", vars(options).get("password", "") or "")
        options = build_parser().parse_args(["set-permissions", "bob", "c", "w", "r"])
        self.assertNotEqual(vars(options).get("user"), "bob")

    def test_add_vhost_takes_a_backend_string(self):
        self.assertEqual(build_parser().parse_args(["add-vhost", "team", "--backend", "sqlite"]).backend, "sqlite")
        self.assertIsNone(build_parser().parse_args(["add-vhost", "team"]).backend)
