"""TopicTrie on its own: word splitting, '*' and '#' matching, removal and pathological keys."""

import threading

import pytest

from brokerd.model.topic import TopicTrie, split_words
from tests.support.broker import TOPIC_MATCH_CASES


def trie_with(*bindings):
    """A trie holding each (binding key, destination) pair."""
    trie = TopicTrie()
    for binding_key, destination in bindings:
        trie.add(binding_key, destination)
    return trie


# -- word splitting


@pytest.mark.parametrize(
    "key, words",
    [
        ("", []),
        ("a", ["a"]),
        ("a.b.c", ["a", "b", "c"]),
        ("a..b", ["a", "", "b"]),
        ("a.", ["a", ""]),
        (".a", ["", "a"]),
        (".", ["", ""]),
        ("..", ["", "", ""]),
    ],
)
def test_split_words_follows_rabbitmq(key, words):
    assert split_words(key) == words


# -- matching


@pytest.mark.parametrize("binding_key, routing_key, matches", TOPIC_MATCH_CASES)
def test_binding_key_matches_routing_key(binding_key, routing_key, matches):
    trie = trie_with((binding_key, "q"))
    assert trie.match(routing_key) == ({"q"} if matches else set())


def test_match_returns_every_matching_destination_once():
    trie = trie_with(("a.*", "q1"), ("#", "q2"), ("a.b", "q3"), ("a.#", "q1"), ("x.*", "q4"))
    assert trie.match("a.b") == {"q1", "q2", "q3"}


def test_match_on_empty_trie_is_empty():
    assert TopicTrie().match("a.b") == set()
    assert TopicTrie().match("") == set()


def test_star_in_routing_key_is_a_literal_word():
    trie = trie_with(("a.*", "star"), ("a.b", "literal"))
    assert trie.match("a.*") == {"star"}


def test_many_bindings_on_different_branches():
    trie = TopicTrie()
    for index in range(200):
        trie.add(f"stock.{index}.#", f"q{index}")
    assert trie.match("stock.17.nyse.ibm") == {"q17"}
    assert trie.match("stock.200.x") == set()


# -- removal


def test_removing_the_only_binding_leaves_nothing_matching():
    trie = trie_with(("a.#.b", "q"))
    trie.remove("a.#.b", "q")
    for routing_key in ("a.b", "a.x.b", "", "a"):
        assert trie.match(routing_key) == set()


def test_removing_every_binding_prunes_every_branch():
    keys = ["a.b.c", "a.#", "a.*.c", "#", "x..y", ""]
    trie = TopicTrie()
    for key in keys:
        trie.add(key, "q")
    for key in keys:
        trie.remove(key, "q")
    assert trie.match("a.b.c") == set()
    assert trie._root.children == {}, "removed bindings left empty branches behind"
    assert trie._root.destinations == {}


def test_removing_one_of_two_identical_bindings_keeps_the_other():
    trie = trie_with(("a.*", "q"), ("a.*", "q"))
    trie.remove("a.*", "q")
    assert trie.match("a.b") == {"q"}
    trie.remove("a.*", "q")
    assert trie.match("a.b") == set()


def test_removing_one_destination_keeps_others_on_the_same_key():
    trie = trie_with(("a.b", "q1"), ("a.b", "q2"))
    trie.remove("a.b", "q1")
    assert trie.match("a.b") == {"q2"}


def test_removing_a_longer_key_keeps_its_prefix_key():
    trie = trie_with(("a", "short"), ("a.b", "long"))
    trie.remove("a.b", "long")
    assert trie.match("a") == {"short"}
    assert trie.match("a.b") == set()


def test_removing_a_prefix_key_keeps_the_longer_key():
    trie = trie_with(("a", "short"), ("a.b", "long"))
    trie.remove("a", "short")
    assert trie.match("a") == set()
    assert trie.match("a.b") == {"long"}


def test_removing_an_unknown_binding_changes_nothing():
    trie = trie_with(("a.b", "q"))
    trie.remove("a.c", "q")
    trie.remove("a.b", "other")
    trie.remove("a.b.c.d", "q")
    assert trie.match("a.b") == {"q"}


# -- pathological keys


def _match_within(trie, routing_key, seconds):
    """Runs trie.match in a thread; returns its result, failing if it is not done by the deadline."""
    result = []
    worker = threading.Thread(target=lambda: result.append(trie.match(routing_key)), daemon=True)
    worker.start()
    worker.join(timeout=seconds)  # returns as soon as the match is done
    assert not worker.is_alive(), f"matching {len(split_words(routing_key))} words took longer than {seconds} s"
    return result[0]


def test_many_hashes_against_many_words_finish_fast():
    # A backtracking matcher tries C(words + hashes, hashes) splits here (~1e14).
    trie = trie_with(("#.#.#.#.#.#.#.#.x", "never"), ("#.#.#.#", "always"), ("#.a.#.a.#.a.#.b", "never2"))
    longest_key = ".".join(["a"] * 128)  # 255 bytes, the longest routing key
    assert _match_within(trie, longest_key, seconds=10) == {"always"}


def test_many_empty_words_finish_fast():
    trie = trie_with(("#.#.#.#.#.#.#.#.x", "never"), ("#.*.#.*.#", "always"))
    empty_words_key = "." * 255  # 256 empty words
    assert _match_within(trie, empty_words_key, seconds=10) == {"always"}
