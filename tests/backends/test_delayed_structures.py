"""The in-memory structures the delayed-message stores share: the handle map
(arrays per block of handles, dense or sparse), the sorted runs and memory
buckets of L{backends.common.sorted_runs}, and the memory store's
sorted keys; each checked against a plain dict or list."""

import random
from array import array

from twisted.trial import unittest

from backends.common.handle_map import BLOCK, HandleMap, _Dense, _Sparse
from backends.common.sorted_runs import MAX_RUNS, MemoryBucket, SortedRun, merge_runs, sorted_run, window
from backends.memory.sortedkeys import SortedKeys


class HandleMapTests(unittest.TestCase):
    def test_it_answers_as_a_dict_would_through_dense_and_sparse_blocks(self):
        rolls = random.Random(7)
        kept, expected = HandleMap(("Q", "I")), {}
        for handle in range(1, 20 * BLOCK):
            kept.add(handle, handle * 3, handle % 1000)
            expected[handle] = (handle * 3, handle % 1000)
        for handle in rolls.sample(sorted(expected), 20 * BLOCK - 401):  # about 20 left per block
            self.assertEqual(kept.pop(handle), expected.pop(handle))
        self.assertEqual(kept.pop(handle), None, "popped twice")
        self.assertEqual(len(kept), len(expected))
        self.assertEqual(list(kept.items()), sorted(expected.items()))
        for handle in range(0, 21 * BLOCK, 17):
            self.assertEqual(handle in kept, handle in expected)
            self.assertEqual(kept.get(handle), expected.get(handle))
        kinds = {type(block) for block in kept._blocks.values()}
        self.assertIn(_Sparse, kinds, "blocks with few handles left turn sparse")
        self.assertLess(kept.memory(), 20 * BLOCK * 13 // 4)

    def test_a_sparse_block_turns_dense_again_when_a_handle_is_added(self):
        kept = HandleMap(("Q",))
        for handle in range(2 * BLOCK):
            kept.add(handle, handle)
        for handle in range(1, BLOCK):
            kept.pop(handle)
        self.assertIs(type(kept._blocks[0]), _Sparse)
        kept.add(5, 55)
        self.assertIs(type(kept._blocks[0]), _Dense)
        self.assertEqual([(handle, values) for handle, values in kept.items() if handle < BLOCK],
                         [(0, (0,)), (5, (55,))])

    def test_the_newest_block_stays_dense(self):
        kept = HandleMap()
        for handle in range(10):
            kept.add(handle)
            kept.pop(handle)
            kept.add(handle + 100)
        self.assertEqual(len(kept), 10)
        self.assertIs(type(kept._blocks[0]), _Dense)

    def test_add_many_is_many_adds(self):
        one, many = HandleMap(("Q",)), HandleMap(("Q",))
        handles = array("Q", random.Random(3).sample(range(10 * BLOCK), 3000))
        values = array("Q", (handle + 1 for handle in handles))
        for handle, value in zip(handles, values):
            one.add(handle, value)
        many.add_many(handles, values)
        self.assertEqual(list(one.items()), list(many.items()))
        self.assertEqual(len(one), len(many))
        self.assertRaises(ValueError, HandleMap().add, -1)


def entries(count, rolls):
    """C{count} entries with increasing handles and random due times (many equal)."""
    return [(rolls.randrange(50), handle) for handle in range(1, count + 1)]


class SortedRunTests(unittest.TestCase):
    def test_windows_of_merged_runs_match_a_sorted_list(self):
        rolls = random.Random(11)
        bucket, everything = MemoryBucket(("Q",)), []
        for due, handle in entries(2000, rolls):
            bucket.add(due, handle, handle * 2)
            everything.append((due, handle, handle * 2))
            if handle % 150 == 0:
                bucket.view(None)  # the tail becomes a run
        released = set(rolls.sample(range(1, 2001), 700))
        live = sorted(entry for entry in everything if entry[1] not in released)
        runs = bucket.view(released.__contains__)
        self.assertLessEqual(len(runs), MAX_RUNS + 1)
        for cursor in (None, (0, 0), (10, 500), (10, 10_000), (49, 1999), (60, 0)):
            for until, limit in ((1 << 62, 100), (20, 5000), (10, 3)):
                expected = [entry for entry in live if (cursor is None or entry[:2] > cursor) and entry[0] <= until]
                self.assertEqual(window(runs, cursor, until, limit, released.__contains__), expected[:limit])
        merged = merge_runs(runs, released.__contains__)
        self.assertEqual(list(zip(merged.dues, merged.handles, merged.extra[0])), live)

    def test_a_sorted_run_keeps_handle_order_among_equal_due_times(self):
        run = sorted_run((array("Q", [5, 3, 5, 3]), array("Q", [1, 2, 3, 4]), array("Q", [10, 20, 30, 40])))
        self.assertEqual(list(zip(run.dues, run.handles, run.extra[0])),
                         [(3, 2, 20), (3, 4, 40), (5, 1, 10), (5, 3, 30)])
        self.assertEqual(run.start((3, 2)), 1)
        self.assertEqual(run.start((4, 0)), 2)
        self.assertEqual(SortedRun(array("Q"), array("Q")).start((1, 1)), 0)


class SortedKeysTests(unittest.TestCase):
    def test_it_keeps_keys_in_order_through_splits_and_removals(self):
        rolls = random.Random(5)
        keys, expected = SortedKeys(), []
        for handle in range(5000):
            key = (rolls.randrange(300), handle)
            keys.add(key)
            expected.append(key)
        for key in rolls.sample(expected, 2500):
            self.assertTrue(keys.remove(key))
            expected.remove(key)
        self.assertFalse(keys.remove((1000, 1)))
        expected.sort()
        self.assertEqual(list(keys.after(None)), expected)
        self.assertEqual(len(keys), len(expected))
        for cursor in ((0, 0), expected[700], (150, 10 ** 9), (400, 0)):
            self.assertEqual(list(keys.after(cursor)), [key for key in expected if key > cursor])
