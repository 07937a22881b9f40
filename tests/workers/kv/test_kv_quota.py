"""Per-tenant cache quotas: an over-quota scope's leaves are evicted first, so one
tenant's flood of one-off prompts cannot push another tenant's hot prefixes out."""

from __future__ import annotations

import random

from tests.workers.kv.kv_test_support import make_manager

B = 4
NUM_BLOCKS = 24
DOCS = [[100 + 10 * d + i for i in range(3 * B)] for d in range(3)]  # 3 blocks each


def serve(manager, seq_id: int, tokens: list[int], scope: str, quota: int | None = None) -> int:
    """Admit, compute, cache and finish one prompt; returns its cached tokens."""
    num_cached = manager.admit(seq_id, tokens, scope, max_cached_tokens=quota)
    assert num_cached is not None
    assert manager.append_slots(seq_id, len(tokens) - num_cached)
    manager.commit(seq_id, tokens)
    manager.free(seq_id)
    manager.check_invariants()
    return num_cached


def reader_hit_rate(flood_quota: int | None, flood: bool) -> float:
    """Tenant ``reader`` re-reads three documents (plus a fresh question each time)
    while, with ``flood``, tenant ``flooder`` sends unique prompts between reads."""
    manager = make_manager(NUM_BLOCKS, B)
    rng = random.Random(0)
    seq_id = hit = total = 0
    for round_ in range(12):
        for doc in DOCS:
            seq_id += 1
            prompt = doc + [900 + round_, 901]
            hit += serve(manager, seq_id, prompt, "reader")
            total += len(doc)
            for _ in range(3 if flood else 0):
                seq_id += 1
                junk = [rng.randrange(1000, 50_000) for _ in range(4 * B)]
                serve(manager, seq_id, junk, "flooder", flood_quota)
    return hit / total


def test_a_flood_under_quota_leaves_the_other_tenants_hit_rate_as_it_was():
    quiet = reader_hit_rate(None, flood=False)
    assert quiet > 0.9
    assert reader_hit_rate(None, flood=True) < quiet  # without a quota the flood hurts
    assert reader_hit_rate(4 * B, flood=True) == quiet


def test_over_quota_scope_is_evicted_before_older_leaves_of_others():
    manager = make_manager(8, B)
    serve(manager, 1, [1, 2, 3, 4], "a")  # one cached block of a, the oldest
    serve(manager, 2, [10, 11, 12, 13, 14, 15, 16, 17], "b", quota=B)  # b: one 2-block leaf
    cache = manager.prefix_cache
    assert (cache.tree.num_tokens("a"), cache.tree.num_tokens("b")) == (B, 2 * B)
    assert cache.evict(1) == 2  # b's leaf, though a's is older
    assert (cache.tree.num_tokens("a"), cache.tree.num_tokens("b")) == (B, 0)
    serve(manager, 3, [20, 21, 22, 23], "b")  # b within its quota: plain LRU again
    assert cache.evict(1) == 1
    assert (cache.tree.num_tokens("a"), cache.tree.num_tokens("b")) == (0, B)
    manager.check_invariants()


def test_the_latest_quota_for_a_scope_wins_and_none_removes_it():
    manager = make_manager(8, B)
    serve(manager, 1, [1, 2, 3, 4], "a")
    serve(manager, 2, [10, 11, 12, 13], "b", quota=0)
    serve(manager, 3, [20, 21, 22, 23], "b", quota=None)
    manager.prefix_cache.evict(1)
    assert manager.prefix_cache.tree.num_tokens("a") == 0  # b has no quota any more
