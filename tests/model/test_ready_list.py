"""L{ReadyList} and L{PagedRun}: a queue's ready entries, in-memory entries and runs of store handles, in order."""

from array import array

import pytest

from brokerd.model.message import Message, QueuedMessage
from brokerd.model.ready import PagedRun, PriorityReady, ReadyList
from tests.support.broker import properties

QUEUE = object()  # what the list hands to the entries it materializes; it never looks inside


def entry(sequence, handle=None, redelivered=False, body=None):
    """An in-memory entry with a message whose body names its sequence."""
    message = Message("", "q", properties(persistent=handle is not None), body or b"m%d" % sequence)
    return QueuedMessage(message, QUEUE, sequence, handle, redelivered)


def drain(ready):
    """Pop everything: (sequence, handle, redelivered, body or None) of each entry, in order."""
    popped = []
    while ready:
        taken = ready.popleft()
        popped.append((taken.sequence, taken.handle, taken.redelivered,
                       None if taken.message is None else taken.message.body))
    return popped


def runs(ready):
    """The runs the list holds now, as (first sequence still in it, entries left, redelivered)."""
    return [(item.sequence, len(item), item.redelivered) for item in ready._items if type(item) is PagedRun]


def mixed():
    """Two objects, a run of three, an object, a run of two (redelivered): sequences 0..7, handles 100+."""
    ready = ReadyList(QUEUE)
    ready.append(entry(0, 100))
    ready.append(entry(1))  # transient: no handle
    ready.append_paged([102, 103, 104], 2, False)
    ready.append(entry(5, 105))
    ready.append_paged(array("Q", [106, 107]), 6, True)
    return ready


# -- PagedRun


def test_a_paged_run_counts_what_is_left_and_numbers_from_its_head():
    run = PagedRun(10, False)
    run.handles.extend([1, 2, 3])
    assert (len(run), run.sequence, run.next_sequence) == (3, 10, 13)
    run.head = 2
    assert (len(run), run.sequence, run.next_sequence) == (1, 12, 13)


# -- order, length, truth


def test_an_empty_list_is_false_and_has_length_zero():
    ready = ReadyList(QUEUE)
    assert (len(ready), bool(ready), list(ready.handles()), ready.in_memory()) == (0, False, [], [])


def test_entries_and_runs_come_out_in_order():
    ready = mixed()
    assert (len(ready), bool(ready)) == (8, True)
    assert drain(ready) == [
        (0, 100, False, b"m0"),
        (1, None, False, b"m1"),
        (2, 102, False, None),
        (3, 103, False, None),
        (4, 104, False, None),
        (5, 105, False, b"m5"),
        (6, 106, True, None),
        (7, 107, True, None),
    ]
    assert (len(ready), bool(ready), list(ready.handles())) == (0, False, [])


def test_length_follows_every_change():
    ready = ReadyList(QUEUE)
    lengths = []
    ready.append_paged([1, 2, 3], 0, False)
    lengths.append(len(ready))
    ready.append(entry(3, 4))
    lengths.append(len(ready))
    ready.popleft()
    lengths.append(len(ready))
    ready.appendleft(entry(0, 1))
    lengths.append(len(ready))
    ready.extendleft([entry(-1), entry(-2)])
    lengths.append(len(ready))
    ready.clear()
    lengths.append(len(ready))
    assert lengths == [3, 4, 3, 4, 6, 0]


def test_bytes_count_the_bodies_of_the_entries_kept_as_objects_through_every_change():
    ready = ReadyList(QUEUE)
    sizes = []
    ready.append_paged([1, 2], 0, False)
    sizes.append(ready.bytes)
    ready.append(entry(2, 3, body=b"abc"))
    ready.append(entry(3, body=b"defgh"))
    sizes.append(ready.bytes)
    paged = ready.popleft()  # out of the run: no message, no bytes
    sizes.append(ready.bytes)
    ready.appendleft(paged)  # put back unloaded, as when the store failed
    sizes.append(ready.bytes)
    ready.popleft()
    ready.popleft()
    ready.popleft()  # b"abc"
    sizes.append(ready.bytes)
    ready.extendleft([entry(0, body=b"xy"), entry(1, body=b"z")])
    sizes.append(ready.bytes)
    ready.put_back([entry(-1, body=b"1234")])
    sizes.append(ready.bytes)
    removed = ready.remove_where(lambda item: item.sequence < 1)
    sizes.append(ready.bytes)
    ready.clear()
    sizes.append(ready.bytes)
    assert [item.sequence for item in removed] == [-1, 0]
    assert sizes == [0, 8, 8, 8, 5, 8, 12, 6, 0]


def test_a_priority_list_counts_the_bytes_of_every_level():
    ready = PriorityReady(QUEUE, 2)

    def prioritised(sequence, priority, body):
        message = Message("", "q", properties(priority=priority), body)
        return QueuedMessage(message, QUEUE, sequence)

    ready.append(prioritised(0, 0, b"low"))
    ready.append(prioritised(1, 2, b"high!"))
    assert ready.bytes == 8
    taken = ready.popleft()
    assert (taken.message.body, ready.bytes) == (b"high!", 3)
    ready.appendleft(taken)
    ready.put_back([prioritised(2, 1, b"mid")])
    assert ready.bytes == 11
    assert sorted(item.message.body for item in ready.remove_where(lambda item: item.sequence != 1)) == [b"low", b"mid"]
    assert ready.bytes == 5
    ready.clear()
    assert ready.bytes == 0


# -- append_paged joins a run only where it follows it


def test_append_paged_joins_the_last_run_when_its_sequences_follow_on():
    ready = ReadyList(QUEUE)
    ready.append_paged([1, 2], 0, False)
    ready.append_paged([3], 2, False)
    ready.append_paged((4, 5), 3, False)
    assert runs(ready) == [(0, 5, False)]
    assert [taken.sequence for taken in (ready.popleft() for _ in range(5))] == [0, 1, 2, 3, 4]


def test_append_paged_takes_handles_in_an_array_of_any_integer_kind():
    # A store may give its handles as array("q") or array("L"): a run is extended with them all the same.
    ready = ReadyList(QUEUE)
    ready.append_paged(array("q", [1, 2]), 0, False)
    ready.append_paged(array("L", [3]), 2, False)
    ready.append_paged(array("Q", [4]), 3, False)
    assert runs(ready) == [(0, 4, False)]
    assert [ready.popleft().handle for _ in range(4)] == [1, 2, 3, 4]


def test_append_paged_starts_a_run_after_a_gap_in_sequences():
    ready = ReadyList(QUEUE)
    ready.append_paged([1, 2], 0, False)
    ready.append_paged([3], 5, False)
    assert runs(ready) == [(0, 2, False), (5, 1, False)]
    assert [(taken.sequence, taken.handle) for taken in (ready.popleft() for _ in range(3))] == [
        (0, 1), (1, 2), (5, 3)
    ]


def test_append_paged_starts_a_run_when_the_redelivered_flag_differs():
    ready = ReadyList(QUEUE)
    ready.append_paged([1, 2], 0, True)
    ready.append_paged([3, 4], 2, False)
    ready.append_paged([5], 4, True)
    assert runs(ready) == [(0, 2, True), (2, 2, False), (4, 1, True)]
    assert [taken.redelivered for taken in (ready.popleft() for _ in range(5))] == [True, True, False, False, True]


def test_append_paged_never_joins_a_run_that_an_object_follows():
    ready = ReadyList(QUEUE)
    ready.append_paged([1], 0, False)
    ready.append(entry(1, 2))
    ready.append_paged([3], 2, False)
    assert runs(ready) == [(0, 1, False), (2, 1, False)]
    assert [taken.handle for taken in (ready.popleft() for _ in range(3))] == [1, 2, 3]


def test_append_paged_joins_a_partly_consumed_run():
    ready = ReadyList(QUEUE)
    ready.append_paged([1, 2, 3], 0, False)
    ready.popleft()
    ready.append_paged([4], 3, False)
    assert runs(ready) == [(1, 3, False)]
    assert drain(ready) == [(1, 2, False, None), (2, 3, False, None), (3, 4, False, None)]


def test_append_paged_with_no_handles_leaves_the_list_usable():
    # A durable queue recovered empty gets restore_paged(()): nothing must stay behind in the list.
    ready = ReadyList(QUEUE)
    ready.append_paged((), 0, True)
    assert (len(ready), bool(ready), list(ready.handles())) == (0, False, [])
    ready.append(entry(0, 7))
    assert ready.head_sequence() == 0
    assert drain(ready) == [(0, 7, False, b"m0")]


def test_append_paged_with_no_handles_after_a_run_leaves_it_alone():
    ready = ReadyList(QUEUE)
    ready.append_paged([1, 2], 0, False)
    ready.append_paged((), 2, False)
    ready.append_paged((), 9, True)
    ready.append(entry(9, 3))
    assert len(ready) == 3
    assert [taken.handle for taken in (ready.popleft() for _ in range(3))] == [1, 2, 3]


# -- popleft, head_sequence


def test_popleft_materializes_a_paged_entry_without_its_message():
    ready = ReadyList(QUEUE)
    ready.append_paged([41, 42], 7, True)
    taken = ready.popleft()
    assert type(taken) is QueuedMessage
    assert (taken.message, taken.queue, taken.sequence, taken.handle, taken.redelivered) == (None, QUEUE, 7, 41, True)
    assert (taken.delivery_count, taken.consumer) == (0, None)
    assert ready.popleft() is not taken


def test_popleft_hands_back_in_memory_entries_themselves():
    ready = ReadyList(QUEUE)
    first = entry(0, 9)
    ready.append(first)
    assert ready.popleft() is first


def test_popleft_on_an_empty_list_raises():
    with pytest.raises(IndexError):
        ReadyList(QUEUE).popleft()


def test_head_sequence_follows_the_head_into_and_through_runs():
    ready = mixed()
    heads = []
    while ready:
        heads.append(ready.head_sequence())
        ready.popleft()
    assert heads == [0, 1, 2, 3, 4, 5, 6, 7]


# -- putting entries back at the head


def test_appendleft_and_extendleft_put_entries_before_runs_in_the_order_given():
    ready = ReadyList(QUEUE)
    ready.append_paged([3, 4], 3, False)
    ready.appendleft(entry(2, 2, redelivered=True))
    ready.extendleft(reversed([entry(0, 0, True), entry(1, None, True)]))
    assert ready.head_sequence() == 0
    assert [(sequence, handle, redelivered) for sequence, handle, redelivered, _ in drain(ready)] == [
        (0, 0, True), (1, None, True), (2, 2, True), (3, 3, False), (4, 4, False)
    ]


def test_extendleft_takes_any_iterable_and_counts_it():
    ready = ReadyList(QUEUE)
    ready.append_paged([5], 5, False)
    ready.extendleft(entry(sequence, sequence) for sequence in (4, 3))
    assert len(ready) == 3
    assert [taken.sequence for taken in (ready.popleft() for _ in range(3))] == [3, 4, 5]


def test_a_materialized_entry_put_back_comes_out_again_before_the_rest_of_its_run():
    ready = ReadyList(QUEUE)
    ready.append_paged([10, 11, 12], 0, False)
    taken = ready.popleft()
    ready.appendleft(taken)
    assert ready.head_sequence() == 0
    assert list(ready.handles()) == [10, 11, 12]
    assert ready.popleft() is taken


# -- handles, in_memory, clear


def test_handles_gives_every_handle_in_order_with_none_for_transient_entries():
    ready = mixed()
    assert list(ready.handles()) == [100, None, 102, 103, 104, 105, 106, 107]
    for _ in range(3):
        ready.popleft()
    assert list(ready.handles()) == [103, 104, 105, 106, 107]


def test_in_memory_lists_only_the_entries_kept_as_objects():
    ready = mixed()
    assert [item.sequence for item in ready.in_memory()] == [0, 1, 5]
    ready.popleft()
    ready.popleft()
    ready.popleft()  # out of the first run
    assert [item.sequence for item in ready.in_memory()] == [5]


def test_clear_empties_the_list_and_it_works_on():
    ready = mixed()
    ready.clear()
    assert (len(ready), bool(ready), list(ready.handles()), ready.in_memory()) == (0, False, [], [])
    ready.append_paged([1], 20, False)
    assert drain(ready) == [(20, 1, False, None)]


# -- long runs


def test_a_long_run_gives_back_memory_once_its_head_passes_65536_entries():
    total = 100_000
    ready = ReadyList(QUEUE)
    ready.append_paged(range(1, total + 1), 1_000, False)
    (run,) = ready._items
    for expected in range(65_535):
        assert ready.popleft().sequence == 1_000 + expected
    assert len(run.handles) == total, "nothing is given back before the head passes 65536 entries"
    taken = ready.popleft()
    assert (taken.sequence, taken.handle) == (1_000 + 65_535, 65_536)
    assert len(run.handles) == total - 65_536, "the handles the head passed were not given back"
    assert (len(ready), ready.head_sequence(), run.head) == (total - 65_536, 1_000 + 65_536, 0)
    assert list(ready.handles())[:2] == [65_537, 65_538]
    rest = [ready.popleft() for _ in range(total - 65_536)]
    assert [(item.sequence, item.handle) for item in rest] == [
        (1_000 + number - 1, number) for number in range(65_537, total + 1)
    ]
    assert (len(ready), bool(ready), list(ready._items)) == (0, False, [])


def test_a_long_run_keeps_its_tail_until_the_head_is_past_half_of_it():
    total = 200_000
    ready = ReadyList(QUEUE)
    ready.append_paged(range(total), 0, True)
    (run,) = ready._items
    for _ in range(100_000):
        ready.popleft()
    assert len(run.handles) == total, "given back while the head had passed less than half the run"
    taken = ready.popleft()
    assert (taken.sequence, taken.handle, taken.redelivered) == (100_000, 100_000, True)
    assert len(run.handles) == total - 100_001
    ready.append_paged([7, 8], total, True)
    assert len(run.handles) == total - 100_001 + 2, "the run no longer joins entries that follow it"
    assert [item.sequence for item in (ready.popleft() for _ in range(len(ready)))][-3:] == [
        total - 1, total, total + 1
    ]


# -- messages a failed store commit lost


def test_removing_handles_takes_out_objects_and_splits_runs_around_the_rest():
    ready = mixed()
    ready.popleft()  # sequence 0
    ready.popleft()  # sequence 1: the first run is at its head now
    taken = ready.remove_handles({103, 105, 107, 999})
    assert sorted(taken) == [103, 105, 107]
    assert (ready.count, ready.bytes) == (3, 0)
    assert runs(ready) == [(2, 1, False), (4, 1, False), (6, 1, True)]  # sequences kept for put_back's order
    assert drain(ready) == [(2, 102, False, None), (4, 104, False, None), (6, 106, True, None)]


def test_removing_handles_no_entry_holds_changes_nothing():
    ready = mixed()
    items = list(ready._items)
    assert ready.remove_handles({1, 2}) == []
    assert list(ready._items) == items and (ready.count, ready.bytes) == (8, 6)


def test_a_priority_queue_removes_handles_on_every_level():
    ready = PriorityReady(QUEUE, 5)
    for sequence, priority in enumerate((0, 5, 3, 5)):
        queued = entry(sequence, 100 + sequence)
        queued.message.properties.priority = priority
        ready.append(queued)
    assert sorted(ready.remove_handles({100, 101})) == [100, 101]
    assert (ready.count, ready.bytes) == (2, 4)
    assert [taken.handle for taken in (ready.popleft(), ready.popleft())] == [103, 102]
