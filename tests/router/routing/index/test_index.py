"""RouterIndex: exact outcomes of hand-written event sequences and of approximate ageing."""

from __future__ import annotations

import pytest

from radix.events import EventBlock, KVEvent
from radix.keys import to_key
from radix.tree import PUBLIC
from router.config import IndexConfig
from router.routing.index import RouterIndex

NS = "ab" * 32
OTHER_NS = "cd" * 32


def stored(*blocks: tuple[str, str | None, list[int]], scope: str = PUBLIC, ns: str = NS) -> KVEvent:
    return KVEvent("w", "e", 1, "stored", ns, scope,
                   tuple(EventBlock(h, p, to_key(t)) for h, p, t in blocks))


def removed(*hashes: str, scope: str = PUBLIC) -> KVEvent:
    return KVEvent("w", "e", 1, "removed", NS, scope, tuple(EventBlock(h) for h in hashes))


def cleared() -> KVEvent:
    return KVEvent("w", "e2", 0, "cleared", NS, PUBLIC)


class Clock:
    """A settable clock for approximate entries."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def index() -> RouterIndex:
    return RouterIndex()


def match(index: RouterIndex, tokens: list[int], scope: str = PUBLIC, ns: str = NS) -> dict:
    return index.match(ns, to_key(tokens), scope)


def test_a_stored_chain_is_a_node_per_block_and_matches_whole_blocks(index):
    index.apply_event("w1", stored(("a0", None, [1, 2, 3, 4]), ("a1", "a0", [5, 6, 7, 8]), ("a2", "a1", [9])))
    assert index.stats().num_nodes == 3
    assert match(index, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]) == {"w1": 9}
    # a prompt leaving block a1 halfway is credited the whole blocks before it
    assert match(index, [1, 2, 3, 4, 5, 6, 0]) == {"w1": 4}
    assert match(index, [2]) == {}
    index.check_invariants()


def test_longer_match_per_worker_in_one_walk(index):
    index.apply_event("w1", stored(("a0", None, [1, 2, 3, 4])))
    index.apply_event("w2", stored(("a0", None, [1, 2, 3, 4]), ("a1", "a0", [5, 6, 7, 8])))
    index.apply_event("w3", stored(("b0", None, [1, 2, 9, 9])))
    assert match(index, [1, 2, 3, 4, 5, 6, 7, 8]) == {"w1": 4, "w2": 8}
    assert match(index, [1, 2, 3, 4, 5, 6, 7]) == {"w1": 4, "w2": 4}
    index.check_invariants()


def test_removal_cascades_up_through_empty_leaves(index):
    index.apply_event("w1", stored(("a0", None, [1, 2, 3, 4])))
    index.apply_event("w2", stored(("a0", None, [1, 2, 3, 4]), ("a1", "a0", [5, 6, 7, 8]), ("a2", "a1", [9, 9])))
    index.apply_event("w2", removed("a2"))
    assert match(index, [1, 2, 3, 4, 5, 6, 7, 8, 9, 9]) == {"w1": 4, "w2": 8}
    assert index.stats().num_tokens == 8
    index.apply_event("w2", removed("a1", "a0"))
    assert match(index, [1, 2, 3, 4, 5]) == {"w1": 4}
    assert (index.stats().num_nodes, index.stats().num_tokens) == (1, 4)
    index.apply_event("w1", removed("a0"))
    assert index.stats().num_trees == 0
    index.check_invariants()


def test_a_removed_middle_block_ends_the_chain_there(index):
    index.apply_event("w1", stored(("a0", None, [1, 2, 3, 4]), ("a1", "a0", [5, 6, 7, 8]), ("a2", "a1", [9])))
    index.apply_event("w1", removed("a1"))
    # a2 is still held, but an engine reuses a chain from the first block only
    assert match(index, [1, 2, 3, 4, 5, 6, 7, 8, 9]) == {"w1": 4}
    index.check_invariants()
    index.apply_event("w1", removed("a2"))
    assert match(index, [1, 2, 3, 4, 5, 6, 7, 8, 9]) == {"w1": 4}
    assert index.stats().num_tokens == 4
    index.check_invariants()


def test_partial_then_full_block_overlap_and_remove_cleanly(index):
    index.apply_event("w1", stored(("a0", None, [1, 2, 3, 4]), ("p1", "a0", [5, 6])))
    index.apply_event("w1", stored(("a1", "a0", [5, 6, 7, 8])))
    index.check_invariants()
    index.apply_event("w1", removed("a1"))
    assert match(index, [1, 2, 3, 4, 5, 6, 7, 8]) == {"w1": 6}
    index.check_invariants()


def test_unknown_removed_duplicate_stored_and_orphans_are_ignored(index):
    index.apply_event("w1", stored(("a0", None, [1, 2, 3, 4])))
    index.apply_event("w1", stored(("a0", None, [1, 2, 3, 4])))
    index.apply_event("w1", removed("ff", "ee"))
    index.apply_event("w1", stored(("c1", "dd", [7, 7, 7, 7])))
    assert match(index, [1, 2, 3, 4]) == {"w1": 4}
    assert index.stats().num_orphan_blocks == 1
    assert index.stats().num_blocks == {"w1": 1}
    index.apply_event("w1", removed("a0"))
    assert match(index, [1, 2, 3, 4]) == {}
    index.check_invariants()


def test_tenant_blocks_are_seen_by_their_tenant_only_and_public_by_all(index):
    index.apply_event("w1", stored(("a0", None, [1, 2, 3, 4])))
    index.apply_event("w1", stored(("t1", "a0", [5, 6, 7, 8]), scope="tenant-a"))
    index.apply_event("w2", stored(("a0", None, [1, 2, 3, 4]), ("a1", "a0", [5, 6, 7, 8])))
    query = [1, 2, 3, 4, 5, 6, 7, 8]
    assert match(index, query, "tenant-a") == {"w1": 8, "w2": 8}
    assert match(index, query, "tenant-b") == {"w1": 4, "w2": 8}
    assert match(index, query, PUBLIC) == {"w1": 4, "w2": 8}
    assert match(index, query, "tenant-a", ns=OTHER_NS) == {}
    index.check_invariants()


def test_a_tenant_block_equal_to_a_public_one_does_not_leak(index):
    index.apply_event("w2", stored(("a0", None, [1, 2, 3, 4]), ("a1", "a0", [5, 6, 7, 8])))
    index.apply_event("w1", stored(("a0", None, [1, 2, 3, 4])))
    index.apply_event("w1", stored(("t1", "a0", [5, 6, 7, 8]), scope="tenant-a"))
    assert match(index, [1, 2, 3, 4, 5, 6, 7, 8], "tenant-b") == {"w1": 4, "w2": 8}
    assert match(index, [1, 2, 3, 4, 5, 6, 7, 8], "tenant-a") == {"w1": 8, "w2": 8}


def test_reset_worker_and_cleared_drop_only_that_worker(index):
    index.apply_event("w1", stored(("a0", None, [1, 2, 3, 4]), ("a1", "a0", [5, 6, 7, 8])))
    index.apply_event("w2", stored(("a0", None, [1, 2, 3, 4])))
    index.apply_event("w2", stored(("t0", None, [1, 2, 3, 4]), scope="tenant-a"))
    index.reset_worker("w1")
    assert match(index, [1, 2, 3, 4, 5, 6, 7, 8], "tenant-a") == {"w2": 4}
    assert index.stats().num_tokens == 4  # one block, held in two scopes
    index.check_invariants()
    index.apply_event("w2", cleared())
    assert index.stats().num_trees == 0
    assert match(index, [1, 2, 3, 4]) == {}
    index.check_invariants()


def test_speculative_entry_expires_after_its_ttl():
    clock = Clock()
    index = RouterIndex(IndexConfig(speculative_ttl_s=2.0), clock=clock)
    index.note_routed(NS, "w1", to_key([1, 2, 3, 4, 5]), "tenant-a")
    assert match(index, [1, 2, 3, 9], "tenant-a") == {"w1": 3}
    assert match(index, [1, 2, 3], "tenant-b") == {}
    clock.now += 1.9
    assert match(index, [1, 2, 3, 4, 5], "tenant-a") == {"w1": 5}
    clock.now += 0.2
    assert match(index, [1, 2, 3, 4, 5], "tenant-a") == {}
    assert index.stats().num_approx_tokens == {"w1": 0}
    index.check_invariants()


def test_a_refreshed_prefix_outlives_the_older_longer_entry():
    clock = Clock()
    index = RouterIndex(IndexConfig(speculative_ttl_s=2.0), clock=clock)
    index.note_routed(NS, "w1", to_key([1, 2, 3, 4, 5, 6]), PUBLIC)
    clock.now += 1.0
    index.note_routed(NS, "w1", to_key([1, 2, 3, 7]), PUBLIC)
    clock.now += 1.5
    assert match(index, [1, 2, 3, 4, 5, 6]) == {"w1": 3}
    assert match(index, [1, 2, 3, 7]) == {"w1": 4}
    clock.now += 1.0
    assert match(index, [1, 2, 3, 7]) == {}
    index.check_invariants()


def test_approximate_worker_keeps_entries_longer_and_evicts_lru_past_capacity():
    clock = Clock()
    index = RouterIndex(IndexConfig(speculative_ttl_s=2.0, approximate_ttl_s=60.0), clock=clock)
    index.set_approximate("oa", capacity_tokens=10)
    index.note_routed(NS, "oa", to_key([1, 1, 1, 1]), PUBLIC)
    clock.now += 1
    index.note_routed(NS, "oa", to_key([2, 2, 2, 2]), PUBLIC)
    clock.now += 1
    index.note_routed(NS, "oa", to_key([1, 1, 1, 1]), PUBLIC)
    clock.now += 1
    index.note_routed(NS, "oa", to_key([3, 3, 3, 3]), PUBLIC)
    assert match(index, [1, 1, 1, 1]) == {"oa": 4}
    assert match(index, [2, 2, 2, 2]) == {}
    assert match(index, [3, 3, 3, 3]) == {"oa": 4}
    clock.now += 30
    assert match(index, [3, 3, 3, 3]) == {"oa": 4}
    clock.now += 31
    assert match(index, [3, 3, 3, 3]) == {}
    index.check_invariants()


def test_matched_is_the_max_of_exact_and_approximate_and_reset_drops_both():
    clock = Clock()
    index = RouterIndex(clock=clock)
    index.apply_event("w1", stored(("a0", None, [1, 2, 3, 4])))
    index.note_routed(NS, "w1", to_key([1, 2, 3, 4, 5, 6]), PUBLIC)
    index.note_routed(NS, "w2", to_key([1, 2]), PUBLIC)
    assert match(index, [1, 2, 3, 4, 5, 6]) == {"w1": 6, "w2": 2}
    clock.now += 5
    assert match(index, [1, 2, 3, 4, 5, 6]) == {"w1": 4}
    index.note_routed(NS, "w1", to_key([1, 2, 3, 4, 5, 6]), PUBLIC)
    index.reset_worker("w1")
    assert match(index, [1, 2, 3, 4, 5, 6]) == {}


def test_the_routed_part_of_a_match_is_what_only_a_speculative_entry_vouches_for():
    clock = Clock()
    index = RouterIndex(clock=clock)
    index.set_approximate("oa")
    index.apply_event("w1", stored(("a0", None, [1, 2, 3, 4])))
    for worker_id in ("w1", "w2", "oa"):
        index.note_routed(NS, worker_id, to_key([1, 2, 3, 4, 5, 6]), PUBLIC)
    key = to_key([1, 2, 3, 4, 5, 6, 7])
    assert index.match_routed(NS, key, PUBLIC) == (
        {"w1": 6, "w2": 6, "oa": 6}, {"w1": 2, "w2": 6}, {})  # oa's note was a sibling's
    index.apply_event("w2", stored(("b0", None, [1, 2, 3, 4]), ("b1", "b0", [5, 6])))
    assert index.match_routed(NS, key, PUBLIC) == ({"w1": 6, "w2": 6, "oa": 6}, {"w1": 2}, {})
    clock.now += 5
    assert index.match_routed(NS, key, PUBLIC) == ({"w1": 4, "w2": 6, "oa": 6}, {}, {})


def test_an_approximate_workers_unconfirmed_part_is_what_only_requests_in_flight_vouch_for():
    clock = Clock()
    index = RouterIndex(clock=clock)
    index.set_approximate("oa")
    index.note_routed(NS, "oa", to_key([1, 2, 3, 4]), PUBLIC, confirmed=False)
    assert index.match_routed(NS, to_key([1, 2, 3]), PUBLIC) == ({"oa": 3}, {}, {"oa": 3})
    index.confirm_routed(NS, "oa", to_key([1, 2, 3, 4]), PUBLIC)  # its first token came
    for worker_id in ("oa", "w1"):
        index.note_routed(NS, worker_id, to_key([1, 2, 3, 4, 5, 6]), PUBLIC, confirmed=False)
    key = to_key([1, 2, 3, 4, 5, 6, 7])
    assert index.match_routed(NS, key, PUBLIC) == ({"oa": 6, "w1": 6}, {"w1": 6}, {"oa": 2})
    index.confirm_routed(NS, "w1", to_key([1, 2, 3, 4, 5, 6]), PUBLIC)  # w1's events confirm
    index.confirm_routed(NS, "oa", to_key([1, 2, 3, 4, 5, 6]), PUBLIC)
    assert index.match_routed(NS, key, PUBLIC) == ({"oa": 6, "w1": 6}, {"w1": 6}, {})
    index.note_routed(NS, "oa", to_key([1, 2, 3, 4, 5, 6, 7, 8]), PUBLIC, confirmed=False)
    assert index.match_routed(NS, key, PUBLIC) == ({"oa": 7, "w1": 6}, {"w1": 6}, {"oa": 1})
    index.set_stale("w1")  # a stale worker's routes since are approximate: in flight too
    index.note_routed(NS, "w1", to_key([1, 2]), PUBLIC, confirmed=False)
    assert index.match_routed(NS, key, PUBLIC) == ({"oa": 7, "w1": 2}, {}, {"oa": 1, "w1": 2})
    index.check_invariants()


def test_a_stale_worker_is_matched_by_what_was_routed_to_it_until_it_is_exact_again():
    clock = Clock()
    index = RouterIndex(IndexConfig(speculative_ttl_s=2.0, approximate_ttl_s=60.0), clock=clock)
    index.apply_event("w1", stored(("a0", None, [1, 2, 3, 4]), ("a1", "a0", [5, 6, 7, 8])))
    index.apply_event("w2", stored(("b0", None, [1, 2, 3, 4])))
    index.note_routed(NS, "w1", to_key([1, 2, 3, 4, 5, 6, 7, 8, 9]), PUBLIC)
    index.set_stale("w1")
    assert match(index, [1, 2, 3, 4, 5, 6, 7, 8, 9]) == {"w2": 4}
    index.note_routed(NS, "w1", to_key([1, 2, 3, 4, 5, 6]), PUBLIC)
    clock.now += 30  # far past a speculative entry's TTL: it is kept as approximate
    assert index.match_routed(NS, to_key([1, 2, 3, 4, 5, 6, 7, 8]), PUBLIC) == (
        {"w1": 6, "w2": 4}, {}, {})
    index.apply_event("w1", removed("a1"))  # its events still apply while it is stale
    index.set_exact("w1")
    assert match(index, [1, 2, 3, 4, 5, 6, 7, 8]) == {"w1": 4, "w2": 4}
    index.check_invariants()


def test_config_and_capacity_are_validated():
    with pytest.raises(ValueError, match="index.speculative_ttl_s"):
        IndexConfig(speculative_ttl_s=0)
    with pytest.raises(ValueError, match="capacity_tokens"):
        RouterIndex().set_approximate("w", capacity_tokens=-1)


def test_one_removed_event_may_span_scopes_and_runs(index):
    index.apply_event("w1", stored(("a0", None, [1, 2, 3, 4])))
    index.apply_event("w1", stored(("t1", "a0", [5, 6, 7, 8]), ("t2", "t1", [9]), scope="tenant-a"))
    index.apply_event("w1", stored(("b0", None, [7, 7, 7, 7])))
    index.apply_event("w1", removed("a0", "t1", "zz", "b0"))
    # t1 is tenant-a's, removed in an event of scope public; t2 is left without its chain
    assert match(index, [1, 2, 3, 4, 5, 6, 7, 8, 9], "tenant-a") == {}
    assert index.stats().num_blocks == {"w1": 1}
    assert match(index, [7, 7, 7, 7], "tenant-a") == {}
    index.check_invariants()
