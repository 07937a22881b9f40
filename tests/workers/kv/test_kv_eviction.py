"""Eviction: exactly LRU over unlocked leaves (exact block ids), parents after their
children, locked paths never, and the allocator evicts before it fails."""

from __future__ import annotations

from tests.workers.kv.kv_test_support import make_manager

B = 4
A = [1, 2, 3, 4, 5, 6, 7, 8]
A2 = [1, 2, 3, 4, 9, 9, 9, 9]  # shares A's first block
C = [20, 21, 22, 23]


def serve(manager, seq_id: int, tokens: list[int]) -> list[int]:
    """Admit, compute the prompt, cache it, finish; returns the block table it used."""
    num_cached = manager.admit(seq_id, tokens, "t1")
    assert num_cached is not None
    assert manager.append_slots(seq_id, len(tokens) - num_cached)
    table = manager.block_table(seq_id)
    manager.commit(seq_id, tokens)
    manager.free(seq_id)
    return table


def free_blocks(manager) -> set[int]:
    return {b for b in range(manager.pool.num_total_blocks) if manager.pool.is_free(b)}


def filled(num_blocks: int = 8):
    """A cache holding A (blocks 0, 1), A2 (block 0 shared, block 2) and C (block 3).

    Tree: [1 2 3 4] -> {[5 6 7 8], [9 9 9 9]}, and [20 21 22 23]. LRU order of the
    unlocked leaves: A's tail, A2's tail, then (once a leaf) the shared head, then C.
    """
    manager = make_manager(num_blocks, B)
    assert serve(manager, 1, A) == [0, 1]
    assert serve(manager, 2, A2) == [0, 2]
    assert serve(manager, 3, C) == [3]
    assert manager.stats().num_cached_blocks == 4
    return manager


def test_eviction_is_lru_over_leaves_with_parents_after_children():
    manager = filled()
    cache = manager.prefix_cache
    freed_in_order = []
    for _ in range(4):
        before = free_blocks(manager)
        assert cache.evict(1) == 1
        freed_in_order.append(free_blocks(manager) - before)
        manager.check_invariants()
    assert freed_in_order == [{1}, {2}, {0}, {3}]
    assert cache.evict(1) == 0 and cache.tree.num_nodes == 0


def test_a_use_moves_a_path_to_the_back():
    manager = filled()
    assert manager.admit(4, A, "t1") == 7  # a hit on A touches A's path
    manager.free(4)  # (unlocking is a use too)
    freed = []
    for _ in range(4):
        before = free_blocks(manager)
        manager.prefix_cache.evict(1)
        freed.append(free_blocks(manager) - before)
    # A's path is now the most recent; A2's tail, then C, then A's tail, then the head.
    assert freed == [{2}, {3}, {1}, {0}]


def test_a_locked_path_is_never_evicted():
    manager = filled()
    assert manager.admit(4, [*A, 99], "t1") == 8  # locks [1 2 3 4] and [5 6 7 8]
    freed = manager.prefix_cache.evict(100)
    assert freed == 2  # blocks 2 (A2's tail) and 3 (C)
    assert free_blocks(manager) >= {2, 3} and not free_blocks(manager) & {0, 1}
    assert manager.prefix_cache.tree.num_nodes == 2
    manager.free(4)
    manager.check_invariants()
    assert manager.prefix_cache.evict(100) == 2


def test_the_allocator_evicts_lru_blocks_before_it_fails():
    manager = filled(num_blocks=5)  # blocks 0-3 cached, block 4 free
    assert manager.admit(5, [30, 31, 32, 33, 34, 35, 36, 37, 38], "t1") == 0  # needs 3 blocks
    assert manager.block_table(5) == [4, 1, 2]  # the free one, then A's and A2's tails (LRU)
    assert manager.stats().num_evicted_blocks_total == 2
    manager.check_invariants()


def test_a_lock_covers_whole_matched_blocks_only():
    manager = filled()
    assert manager.admit(4, A, "t1") == 7  # holds block 0 and block 1 (partly matched)
    assert manager.block_table(4) == [0, 4]  # block 1 was copied for position 7
    assert manager.prefix_cache.evict(100) == 3  # A's tail (1), A2's tail (2), C (3)
    assert manager.prefix_cache.tree.num_nodes == 1  # [1 2 3 4], locked
    manager.check_invariants()
    manager.free(4)
    assert manager.prefix_cache.evict(100) == 1


def test_admission_that_cannot_fit_holds_nothing_and_evicts_nothing():
    manager = filled(num_blocks=5)
    assert manager.admit(5, A, "t1") == 7  # holds blocks 0 and 4 (a copy of 1)
    before = manager.stats()
    assert (before.num_used_blocks, before.num_cached_blocks, before.num_free_blocks) == (2, 3, 0)
    # Every cached block is evictable, so free + cached is exact: an admission that
    # needs more fails at once, evicting nothing and holding nothing.
    assert manager.admit(6, list(range(40, 56)), "t1") is None  # needs 4 blocks
    assert manager.stats() == before
    manager.check_invariants()
    assert manager.admit(7, list(range(40, 52)), "t1") == 0  # 3 blocks: all cached ones
    after = manager.stats()
    assert (after.num_used_blocks, after.num_cached_blocks, after.num_evicted_blocks_total) == (
        5,
        0,
        3,
    )
    manager.free(5)
    manager.free(7)
    manager.check_invariants()


def test_append_slots_fails_holding_nothing_new_and_the_sequence_can_still_be_freed():
    manager = make_manager(num_blocks=2, block_size=B)
    assert manager.admit(1, [1, 2, 3], "t1") == 0
    assert manager.append_slots(1, 3)
    assert manager.append_slots(1, 5)  # positions 3..7: block 1
    assert not manager.append_slots(1, 1)  # position 8 needs a third block
    assert manager.block_table(1) == [0, 1] and manager.num_computed_tokens(1) == 8
    manager.free(1)
    assert manager.num_free_blocks == 2
    manager.check_invariants()


def test_reset_prefix_cache_drops_every_unheld_block_and_announces_each():
    manager = filled()
    assert manager.admit(4, [*A, 99], "t1") == 8  # holds [1 2 3 4] and [5 6 7 8]
    head = manager.event_log.head_seq
    assert manager.reset_prefix_cache() == 2  # A2's tail (block 2) and C (block 3)
    removed = manager.event_log.since(head, manager.event_log.epoch)
    assert {e.type for e in removed} == {"removed"}
    assert sum(len(e.blocks) for e in removed) == 2
    assert free_blocks(manager) >= {2, 3} and not free_blocks(manager) & {0, 1}
    manager.free(4)
    manager.check_invariants()
    assert manager.reset_prefix_cache() == 2  # A's path, no longer held
    assert manager.stats().num_cached_blocks == 0 and manager.prefix_cache.tree.num_nodes == 0
    assert manager.reset_prefix_cache() == 0
