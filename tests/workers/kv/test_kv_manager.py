"""The engine-facing manager: argument checks, the match cap, scopes, counters, the
null prefix cache."""

from __future__ import annotations

import pytest

from tests.workers.kv.kv_test_support import make_manager

B = 4


def test_admit_checks_its_arguments_and_holds_nothing_when_it_refuses():
    manager = make_manager(8, B)
    with pytest.raises(ValueError, match="empty"):
        manager.admit(1, [], "t1")
    with pytest.raises(ValueError, match="num_public_tokens"):
        manager.admit(1, [1, 2, 3, 4, 5], "t1", num_public_tokens=3)
    with pytest.raises(ValueError, match="num_public_tokens"):
        manager.admit(1, [1, 2, 3], "t1", num_public_tokens=4)
    assert manager.admit(1, [1, 2, 3], "t1") == 0
    with pytest.raises(ValueError, match="already admitted"):
        manager.admit(1, [1, 2, 3], "t1")
    assert manager.admit(2, list(range(100)), "t1") is None  # 25 blocks > 8
    manager.check_invariants()


def test_the_match_is_capped_so_the_last_prompt_token_is_computed():
    manager = make_manager(8, B)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    manager.admit(1, tokens, "t1")
    manager.append_slots(1, 8)
    manager.commit(1, tokens)
    manager.free(1)
    assert manager.admit(2, tokens, "t1") == 7
    assert manager.block_table(2) == [0, 2]  # block 1 copied: position 7 is recomputed
    assert manager.admit(3, tokens[:1], "t1") == 0


def test_tenants_see_their_own_and_public_prefixes_only():
    manager = make_manager(16, B)
    for seq_id, (tokens, scope, public) in enumerate(
        [([1, 2, 3, 4, 5, 6, 7, 8, 9], "t1", 0), ([5, 5, 5, 5, 6, 6, 6, 6, 7], "t1", 4)]
    ):
        manager.admit(seq_id, tokens, scope, public)
        manager.append_slots(seq_id, len(tokens))
        manager.commit(seq_id, tokens)
        manager.free(seq_id)
    assert manager.admit(10, [1, 2, 3, 4, 5, 6, 7, 8, 9], "t2") == 0
    assert manager.admit(11, [5, 5, 5, 5, 6, 6, 6, 6, 7], "t2") == 4
    assert manager.admit(12, [5, 5, 5, 5, 6, 6, 6, 6, 7], "t1") == 8
    assert manager.admit(13, [1, 2, 3, 4, 5, 6, 7, 8, 9], "t1") == 8
    manager.check_invariants()


def test_commit_rejects_tokens_that_are_not_computed():
    manager = make_manager(8, B)
    manager.admit(1, [1, 2, 3, 4, 5], "t1")
    manager.append_slots(1, 3)
    with pytest.raises(ValueError, match="cannot commit"):
        manager.commit(1, [1, 2, 3, 4, 5])
    manager.commit(1, [1, 2, 3, 4, 5], 3)
    assert manager.prefix_cache.num_cached_tokens == 3
    manager.commit(1, [1, 2, 3, 4, 5], 0)  # nothing to do
    with pytest.raises(KeyError):
        manager.commit(99, [1])


def test_fork_and_free_edge_cases():
    manager = make_manager(8, B)
    manager.admit(1, [1, 2, 3], "t1")
    with pytest.raises(ValueError, match="already admitted"):
        manager.fork(1, 1)
    with pytest.raises(KeyError):
        manager.fork(99, 2)
    manager.free(99)  # unknown: no-op
    manager.fork(1, 2)
    manager.free(1)
    manager.free(1)
    assert manager.block_table(2) == [0]
    manager.free(2)
    assert manager.num_free_blocks == 8
    manager.check_invariants()


def test_counters():
    manager = make_manager(8, B)
    tokens = [1, 2, 3, 4, 5, 6]
    manager.admit(1, tokens, "t1")
    manager.append_slots(1, 6)
    manager.commit(1, tokens)
    manager.free(1)
    manager.admit(2, [*tokens, 7], "t1")  # hit 6, copies block 1
    stats = manager.stats()
    assert stats.prefix_cache_queries_tokens_total == 13
    assert stats.prefix_cache_hit_tokens_total == 6
    assert stats.num_cow_copies_total == 1
    assert (stats.num_used_blocks, stats.num_cached_blocks, stats.num_free_blocks) == (2, 1, 5)
    assert stats.kv_cache_usage_ratio == 2 / 8
    assert stats.num_cached_tokens == 6
    manager.free(2)
    assert manager.prefix_cache.evict(8) == 2
    assert manager.stats().num_evicted_blocks_total == 2


def test_the_null_prefix_cache_shares_nothing_and_leaks_nothing():
    manager = make_manager(8, B, prefix_caching=False)
    tokens = [1, 2, 3, 4, 5, 6]
    for seq_id in (1, 2):
        assert manager.admit(seq_id, tokens, "t1") == 0
        manager.append_slots(seq_id, 6)
        manager.commit(seq_id, tokens)
    manager.fork(1, 3)
    assert manager.append_slots(3, 1)
    assert manager.stats().num_cow_copies_total == 1  # forks still share and copy on write
    for seq_id in (1, 2, 3):
        manager.free(seq_id)
    assert manager.num_free_blocks == 8 and manager.stats().num_cached_blocks == 0
    head, events = manager.snapshot()
    assert head == 0 and [e.type for e in events] == ["cleared"]
    assert manager.event_log.since(0, manager.event_log.epoch) == []
    manager.check_invariants()
