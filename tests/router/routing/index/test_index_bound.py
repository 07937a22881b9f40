"""``index.max_blocks``: the exact index keeps at most that many distinct blocks, drops
the least recently used leaves first (CLOCK), counts what it drops, and stays
consistent with the tables through later events about dropped blocks."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.sim_cache import SimCache
from radix.keys import to_key
from router.config import IndexConfig
from router.routing.index import RouterIndex

NAMESPACE = "5e" * 32
BLOCK = 4


def test_a_path_in_use_outlives_colder_ones_and_the_bound_holds():
    index = RouterIndex(IndexConfig(max_blocks=12))
    cache = SimCache("w0", NAMESPACE, 10_000, BLOCK)
    hot = to_key(range(100, 116))  # four blocks
    for event in cache.insert(hot, "t"):
        index.apply_event("w0", event)
    for i in range(10):
        for event in cache.insert(to_key([i] * 8), "t"):  # two blocks each
            index.apply_event("w0", event)
        assert index.match(NAMESPACE, hot, "t") == {"w0": 16}
        stats = index.stats()
        assert stats.num_nodes <= 12
        index.check_invariants()
    assert stats.num_evicted_blocks >= 10 * 2 + 4 - 12
    assert index.match(NAMESPACE, to_key([0] * 8), "t") == {}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["w0", "w1"]),
                          st.lists(st.integers(0, 3), min_size=1, max_size=20),
                          st.booleans()), max_size=40),
       st.integers(1, 12))
def test_any_stream_keeps_the_bound_and_never_claims_more_than_unbounded(steps, max_blocks):
    bounded = RouterIndex(IndexConfig(max_blocks=max_blocks))
    unbounded = RouterIndex()
    caches = {w: SimCache(w, NAMESPACE, 40, BLOCK) for w in ("w0", "w1")}
    for worker, seq, evict in steps:
        key = to_key(seq)
        events = caches[worker].evict(8) if evict else caches[worker].insert(key, "t")
        for event in events:
            bounded.apply_event(worker, event)
            unbounded.apply_event(worker, event)
        assert bounded.stats().num_nodes <= max_blocks
        bounded.check_invariants()
        full = unbounded.match(NAMESPACE, key, "t")
        for worker_id, num_tokens in bounded.match(NAMESPACE, key, "t").items():
            assert num_tokens <= full.get(worker_id, 0)
