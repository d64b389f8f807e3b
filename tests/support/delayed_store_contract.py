"""The delayed-message contract of the stores (L{IDelayedMessageStore}), written
once: each backend's C{tests/test_delayed_store_*.py} mixes L{DelayedStoreContract}
into a TestCase with the store-making mixin of its C{tests/test_store_*.py}."""

import random

from twisted.internet import defer
from zope.interface.verify import verifyObject

from brokerd.interfaces import DelayedMessage, IDelayedMessageStore, IMessageStore, StoreCorrupted
from brokerd.model.message import Message
from brokerd.proto import messages_pb2
from brokerd.proto.tables import dict_to_table, table_to_dict
from tests.support.store_contract import FOREVER, JOBS, NOW, OpensStores, message, queue_record

DELAYS = ("/", "delays")
STAGING = ("staging", "later")


def delayed(body, routing_key="jobs", exchange="delays", **headers):
    """A persistent message published to a delayed exchange, its message id its body."""
    properties = messages_pb2.BasicProperties(
        delivery_mode=messages_pb2.PERSISTENT, message_id=body.decode(), content_type="text/plain"
    )
    if headers:
        dict_to_table(headers, properties.headers)
    return Message(exchange, routing_key, properties, body)


def keys(found):
    return [(item.due, item.handle) for item in found]


@defer.inlineCallbacks
def assert_delayed_damage_leaves_queues_working(testcase, store, path, before):
    """
    C{store} was opened on data whose delayed file C{path} (which held
    C{before}) is damaged: its queue "jobs" (holding b"queued") still works
    and survives a restart, its delayed calls fail naming C{path}, and the
    damaged file is left as it was.
    """
    testcase.assertEqual([record.body for _, record, _ in store.recover(JOBS)], [b"queued"])
    failure = yield testcase.assertFailure(store.delayed_after(None, FOREVER, 10), StoreCorrupted)
    testcase.assertEqual(failure.path, path)
    testcase.assertIn(path, str(failure))
    testcase.assertRaises(StoreCorrupted, store.delay, delayed(b"x"), DELAYS, NOW)
    testcase.assertEqual(store.stats()["delayed"], 0)
    store.append(message(b"after"), [JOBS])
    store = yield testcase.reopen(store)
    testcase.assertEqual([record.body for _, record, _ in store.recover(JOBS)], [b"queued", b"after"])
    testcase.assertEqual(open(path, "rb").read(), before, "the damaged file is left as it was, for repair")


def bodies(found):
    return [item.record.body for item in found]


class DelayedStoreContract(OpensStores):
    """
    Mixed into a C{twisted.trial.unittest.TestCase} with what
    L{tests.support.store_contract.StoreContract} needs: C{make_store()},
    C{reopen(store)} and, for durable stores, C{reopen_after_crash(store)}.
    The tests that need a store to outlive a restart are skipped for a store
    that is not durable; for such a store C{reopen} hands back the store itself.
    """

    timeout = 60
    model_seed = 17  # of the random operations checked against a model

    @defer.inlineCallbacks
    def everything(self, store, until=FOREVER, page=10_000):
        """Every kept delayed message due by C{until}, paged through."""
        found, cursor = [], None
        while True:
            window = yield store.delayed_after(cursor, until, page)
            found += window
            if len(window) < page:
                return found
            cursor = (window[-1].due, window[-1].handle)

    # -- the interface

    @defer.inlineCallbacks
    def test_provides_the_delayed_interface(self):
        store = yield self.opened()
        self.assertTrue(verifyObject(IDelayedMessageStore, store))
        self.assertTrue(verifyObject(IMessageStore, store))
        self.assertEqual(store.stats()["delayed"], 0)
        self.assertEqual((yield store.delayed_after(None, FOREVER, 10)), [])

    @defer.inlineCallbacks
    def test_a_due_time_that_is_no_natural_int_is_refused(self):
        store = yield self.opened()
        for due in (-1, 1.5, "5", None, 1 << 63):
            self.assertRaises(ValueError, store.delay, delayed(b"x"), DELAYS, due)
        self.assertRaises(ValueError, store.delay, delayed(b"x"), "delays", NOW)
        self.assertEqual(store.stats()["delayed"], 0)

    # -- order and windows

    @defer.inlineCallbacks
    def test_delayed_messages_come_back_by_due_time_then_handle(self):
        store = yield self.opened()
        dues = [NOW + 30, NOW + 10, NOW + 20, NOW + 10, NOW + 30, NOW + 10, 0]
        handles = [store.delay(delayed(b"m%d" % n), DELAYS, due) for n, due in enumerate(dues)]
        self.assertEqual(handles, sorted(handles))
        self.assertEqual(len(set(handles)), len(handles))
        self.assertTrue(all(type(handle) is int for handle in handles))
        found = yield store.delayed_after(None, FOREVER, 100)
        self.assertEqual(keys(found), sorted(zip(dues, handles)))
        self.assertEqual(bodies(found), [b"m6", b"m1", b"m3", b"m5", b"m2", b"m0", b"m4"])
        self.assertTrue(all(isinstance(item, DelayedMessage) for item in found))
        store = yield self.restarted(store)
        self.assertEqual(bodies((yield self.everything(store))), [b"m6", b"m1", b"m3", b"m5", b"m2", b"m0", b"m4"])

    @defer.inlineCallbacks
    def test_cursor_until_and_limit_bound_a_window(self):
        store = yield self.opened()
        handles = [store.delay(delayed(b"m%d" % n), DELAYS, NOW + 10 * (n // 2)) for n in range(10)]
        all_keys = [(NOW + 10 * (n // 2), handles[n]) for n in range(10)]
        self.assertEqual(keys((yield store.delayed_after(None, NOW + 20, 100))), all_keys[:6])
        self.assertEqual(keys((yield store.delayed_after(None, NOW + 19, 100))), all_keys[:4])
        self.assertEqual(keys((yield store.delayed_after(None, FOREVER, 3))), all_keys[:3])
        self.assertEqual(keys((yield store.delayed_after(all_keys[2], FOREVER, 3))), all_keys[3:6])
        self.assertEqual(keys((yield store.delayed_after(all_keys[2], NOW + 20, 100))), all_keys[3:6])
        self.assertEqual(keys((yield store.delayed_after((NOW + 10, 0), FOREVER, 2))), all_keys[2:4])
        self.assertEqual(keys((yield store.delayed_after((NOW + 10, FOREVER), FOREVER, 2))), all_keys[4:6])
        self.assertEqual((yield store.delayed_after(all_keys[-1], FOREVER, 100)), [])
        self.assertEqual((yield store.delayed_after(None, NOW - 1, 100)), [])
        self.assertEqual((yield store.delayed_after(None, FOREVER, 0)), [])
        self.assertEqual(keys((yield store.delayed_after(list(all_keys[2]), FOREVER, 3))), all_keys[3:6])
        yield self.assertFailure(store.delayed_after("cursor", FOREVER, 3), ValueError)

    @defer.inlineCallbacks
    def test_paging_through_a_thousand_in_windows_of_a_hundred_yields_each_once_in_order(self):
        store = yield self.opened()
        rolls = random.Random(3)
        expected = []
        for number in range(1000):
            due = NOW + rolls.randrange(300) * 1000  # many equal due times
            expected.append((due, store.delay(delayed(b"m%d" % number), DELAYS, due)))
            if number == 600:
                yield store.sync()  # some committed, some not
        expected.sort()
        seen, cursor = [], None
        while True:
            window = yield store.delayed_after(cursor, FOREVER, 100)
            self.assertLessEqual(len(window), 100)
            if not window:
                break
            seen += keys(window)
            cursor = seen[-1]
        self.assertEqual(seen, expected)
        store = yield self.restarted(store)
        self.assertEqual(keys((yield self.everything(store, page=100))), expected)

    @defer.inlineCallbacks
    def test_delays_not_yet_committed_are_seen(self):
        store = yield self.opened()
        first = store.delay(delayed(b"committed"), DELAYS, NOW + 50)
        yield store.sync()
        second = store.delay(delayed(b"buffered"), DELAYS, NOW + 10)
        third = store.delay(delayed(b"later"), DELAYS, NOW + 90)
        found = yield store.delayed_after(None, FOREVER, 10)
        self.assertEqual(keys(found), [(NOW + 10, second), (NOW + 50, first), (NOW + 90, third)])
        self.assertEqual(bodies(found), [b"buffered", b"committed", b"later"])
        self.assertEqual(keys((yield store.delayed_after(None, FOREVER, 1))), [(NOW + 10, second)])

    # -- what comes back

    @defer.inlineCallbacks
    def test_a_delayed_message_comes_back_with_everything_published(self):
        store = yield self.opened()
        published = delayed(b"payload" * 50, routing_key="job.new", color="blue", n=7)
        handle = store.delay(published, STAGING, NOW)
        buffered = yield store.delayed_after(None, FOREVER, 1)
        yield store.sync()
        committed = yield store.delayed_after(None, FOREVER, 1)
        store = yield self.restarted(store)
        restarted = yield store.delayed_after(None, FOREVER, 1)
        for (item,) in (buffered, committed, restarted):
            self.assertEqual((item.due, item.handle, item.exchange), (NOW, handle, STAGING))
            record = item.record
            self.assertEqual((record.exchange, record.routing_key, record.body), ("delays", "job.new", b"payload" * 50))
            self.assertEqual(record.properties.message_id, "payload" * 50)
            self.assertEqual(record.properties.content_type, "text/plain")
            self.assertEqual(record.properties.delivery_mode, messages_pb2.PERSISTENT)
            self.assertEqual(table_to_dict(record.properties.headers), {"color": "blue", "n": 7})

    @defer.inlineCallbacks
    def test_messages_of_several_exchanges_share_one_order(self):
        store = yield self.opened()
        store.delay(delayed(b"a"), DELAYS, NOW + 2)
        store.delay(delayed(b"b", exchange="later"), STAGING, NOW + 1)
        store.delay(delayed(b"c", exchange="other"), ("/", "other"), NOW + 3)
        store = yield self.restarted(store)
        found = yield self.everything(store)
        self.assertEqual([(item.exchange, item.record.body) for item in found],
                         [(STAGING, b"b"), (DELAYS, b"a"), (("/", "other"), b"c")])

    # -- release

    @defer.inlineCallbacks
    def test_released_messages_never_come_back(self):
        store = yield self.opened()
        handles = [store.delay(delayed(b"m%d" % n), DELAYS, NOW + n) for n in range(10)]
        yield store.sync()
        store.release(handles[1])  # committed
        more = [store.delay(delayed(b"m%d" % n), DELAYS, NOW + n) for n in range(10, 14)]
        store.release(more[0])  # not committed yet
        store.release(handles[1])  # twice
        store.release(more[-1] + 1000)  # never given out
        store.release(0)
        expected = [b"m%d" % n for n in (0, *range(2, 10), 11, 12, 13)]
        self.assertEqual(bodies((yield self.everything(store))), expected)
        self.assertEqual(store.stats()["delayed"], 12)
        store = yield self.restarted(store)
        self.assertEqual(bodies((yield self.everything(store))), expected)
        self.assertEqual(store.stats()["delayed"], 12)
        found = yield store.delayed_after(None, NOW + 5, 100)
        for item in found:
            store.release(item.handle)
        store = yield self.restarted(store)
        self.assertEqual(bodies((yield self.everything(store))), expected[5:])
        store = yield self.restarted(store)
        self.assertEqual(bodies((yield self.everything(store))), expected[5:])
        self.assertEqual(store.stats()["delayed"], 7)

    @defer.inlineCallbacks
    def test_a_window_holds_nothing_released_before_it_fires(self):
        store = yield self.opened()
        handles = [store.delay(delayed(b"m%d" % n), DELAYS, NOW + n) for n in range(5)]
        yield store.sync()
        reading = store.delayed_after(None, FOREVER, 5)
        answered = reading.called  # a store that answers at once has read the window already
        store.release(handles[0])
        expected = [b"m%d" % n for n in range(0 if answered else 1, 5)]
        self.assertEqual(bodies((yield reading)), expected)

    @defer.inlineCallbacks
    def test_a_window_is_full_though_released_messages_lie_in_it(self):
        store = yield self.opened()
        handles = [store.delay(delayed(b"m%d" % n), DELAYS, NOW + n) for n in range(30)]
        yield store.sync()
        for handle in handles[:20]:
            store.release(handle)  # not committed yet
        self.assertEqual(bodies((yield store.delayed_after(None, FOREVER, 5))), [b"m%d" % n for n in range(20, 25)])

    @defer.inlineCallbacks
    def test_everything_released_leaves_nothing(self):
        store = yield self.opened()
        handles = [store.delay(delayed(b"m%d" % n), DELAYS, NOW + 7 * n) for n in range(50)]
        yield store.sync()
        for handle in handles:
            store.release(handle)
        store = yield self.restarted(store)
        self.assertEqual((yield store.delayed_after(None, FOREVER, 10)), [])
        self.assertEqual(store.stats()["delayed"], 0)
        after = store.delay(delayed(b"after"), DELAYS, NOW)
        self.assertGreater(after, handles[-1])
        self.assertEqual(bodies((yield self.everything(store))), [b"after"])

    # -- handles

    @defer.inlineCallbacks
    def test_handles_keep_increasing_across_restarts(self):
        store = yield self.opened()
        first = store.delay(delayed(b"a"), DELAYS, NOW)
        cancelled = store.delay(delayed(b"b"), DELAYS, NOW)
        store.release(cancelled)  # before its commit: it need never be written
        store = yield self.restarted(store)
        second = store.delay(delayed(b"c"), DELAYS, NOW)
        self.assertGreater(second, cancelled)
        store.release(first)
        store.release(second)
        store = yield self.restarted(store)
        third = store.delay(delayed(b"d"), DELAYS, NOW)
        self.assertGreater(third, second)
        store = yield self.restarted(store)
        self.assertEqual(keys((yield self.everything(store))), [(NOW, third)])

    # -- figures

    @defer.inlineCallbacks
    def test_stats_count_the_delayed_messages_kept(self):
        store = yield self.opened()
        handles = [store.delay(delayed(b"m%d" % n), DELAYS, NOW + n) for n in range(6)]
        self.assertEqual(store.stats()["delayed"], 6)
        store.release(handles[0])
        store.release(handles[0])
        store.release(handles[-1] + 1)
        yield store.sync()
        store.release(handles[1])
        self.assertEqual(store.stats()["delayed"], 4)
        self.assertTrue(all(isinstance(value, (int, float)) for value in store.stats().values()))
        store = yield self.restarted(store)
        self.assertEqual(store.stats()["delayed"], 4)

    # -- with the queues

    @defer.inlineCallbacks
    def test_queue_messages_and_delayed_messages_keep_apart(self):
        store = yield self.opened()
        store.save_queue(queue_record("jobs"))
        queued = [store.append(message(b"q%d" % n), [JOBS]) for n in range(6)]
        held = [store.delay(delayed(b"d%d" % n), DELAYS, NOW + n) for n in range(6)]
        store.ack(JOBS, queued[0])
        store.release(held[1])
        store = yield self.restarted(store)
        self.assertEqual([record.body for _, record, _ in store.recover(JOBS)], [b"q%d" % n for n in range(1, 6)])
        self.assertEqual(bodies((yield self.everything(store))), [b"d0", b"d2", b"d3", b"d4", b"d5"])
        self.assertEqual((store.stats()["messages"], store.stats()["delayed"]), (5, 5))
        for handle, _, _ in list(store.recover(JOBS)):
            store.ack(JOBS, handle)
        store = yield self.restarted(store)
        self.assertEqual(list(store.recover(JOBS)), [])
        self.assertEqual(bodies((yield self.everything(store))), [b"d0", b"d2", b"d3", b"d4", b"d5"])

    # -- everything at once

    @defer.inlineCallbacks
    def test_random_delays_releases_windows_and_restarts_agree_with_a_model(self):
        store = yield self.opened()
        rolls = random.Random(self.model_seed)
        model, number = {}, 0  # handle -> (due, body)

        def expected(cursor, until, limit):
            return sorted((due, handle, body) for handle, (due, body) in model.items()
                          if (cursor is None or (due, handle) > cursor) and due <= until)[:limit]

        for step in range(400):
            roll = rolls.random()
            if roll < 0.5:
                due = NOW + rolls.randrange(40) * 250
                body = b"m%d" % number
                number += 1
                model[store.delay(delayed(body), DELAYS, due)] = (due, body)
            elif roll < 0.75 and model:
                handle = rolls.choice(sorted(model))
                store.release(handle)
                del model[handle]
                if rolls.random() < 0.2:
                    store.release(handle)  # again: ignored
            elif roll < 0.80:
                yield store.sync()
            elif roll < 0.83:
                store = yield self.restarted(store, crash=store.durable and rolls.random() < 0.5)
            else:
                cursor = None if rolls.random() < 0.3 else (NOW + rolls.randrange(40) * 250,
                                                             rolls.randrange(number + 2))
                until, limit = NOW + rolls.randrange(45) * 250, rolls.randrange(1, 30)
                found = yield store.delayed_after(cursor, until, limit)
                self.assertEqual([(item.due, item.handle, item.record.body) for item in found],
                                 expected(cursor, until, limit), f"step {step}")
            self.assertEqual(store.stats()["delayed"], len(model), f"step {step}")
        store = yield self.restarted(store)
        self.assertEqual([(item.due, item.handle, item.record.body) for item in (yield self.everything(store))],
                         expected(None, FOREVER, len(model)))

    # -- durability (durable stores only)

    @defer.inlineCallbacks
    def test_delays_survive_a_restart_with_their_handles(self):
        store = yield self.opened_durable()
        made = [(NOW + 100 - n, store.delay(delayed(b"m%d" % n), DELAYS, NOW + 100 - n)) for n in range(20)]
        before = yield self.everything(store)
        reopened = yield self.restarted(store)
        self.assertIsNot(reopened, store)
        after = yield self.everything(reopened)
        self.assertEqual(keys(after), sorted(made))
        self.assertEqual([(item.exchange, item.record) for item in after],
                         [(item.exchange, item.record) for item in before])

    @defer.inlineCallbacks
    def test_close_keeps_delays_made_without_a_sync(self):
        store = yield self.opened_durable()
        handle = store.delay(delayed(b"unsynced"), DELAYS, NOW)
        reopened = yield self.reopen(store)
        self.addCleanup(lambda: self._close_quietly(reopened))
        self.assertEqual(keys((yield self.everything(reopened))), [(NOW, handle)])

    @defer.inlineCallbacks
    def test_synced_delays_and_releases_survive_a_crash(self):
        store = yield self.opened_durable()
        store.save_queue(queue_record("jobs"))
        store.append(message(b"queued"), [JOBS])
        handles = [store.delay(delayed(b"m%d" % n), DELAYS, NOW + n % 7) for n in range(40)]
        for handle in handles[::3]:
            store.release(handle)
        expected = yield self.everything(store)
        beside = yield self.restarted(store, crash=True)
        self.assertEqual(keys((yield self.everything(beside))), keys(expected))
        self.assertEqual([record.body for _, record, _ in beside.recover(JOBS)], [b"queued"])
        self.assertEqual(beside.stats()["delayed"], len(expected))
        later = beside.delay(delayed(b"after the crash"), DELAYS, NOW)
        self.assertGreater(later, handles[-1])

    @defer.inlineCallbacks
    def test_a_release_of_a_handle_from_before_a_restart_sticks(self):
        store = yield self.opened_durable()
        handles = [store.delay(delayed(b"m%d" % n), DELAYS, NOW + n) for n in range(5)]
        store = yield self.restarted(store)
        store.release(handles[2])  # a handle the scheduler kept, never read back since the restart
        self.assertEqual(store.stats()["delayed"], 4)
        store = yield self.restarted(store, crash=True)
        self.assertEqual(bodies((yield self.everything(store))), [b"m0", b"m1", b"m3", b"m4"])
