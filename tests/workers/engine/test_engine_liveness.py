"""Liveness on a tiny KV pool: any mix of requests sharing mid-block prefixes, with
forks and aborts, completes in bounded steps with no stall, and afterwards evicting
everything frees every block."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.workers.engine.engine_support import BLOCK_SIZE, collect, make_engine, prompt, request

NUM_BLOCKS = 12  # 192 tokens: a few blocks more than the longest request needs
MAX_STEPS = 2_000

# Three prompt bases; the first two share 37 tokens, so they part inside block 2.
BASES = (prompt(120), prompt(37) + prompt(83, salt=1), prompt(120, salt=2))

request_spec = st.tuples(
    st.integers(0, len(BASES) - 1),  # base
    st.integers(1, 120),  # prompt length (a prefix of the base)
    st.integers(1, 24),  # max_tokens
    st.integers(1, 3),  # n
    st.one_of(st.none(), st.integers(0, 30)),  # abort after this many steps, or never
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.lists(request_spec, min_size=1, max_size=6))
def test_any_request_mix_on_a_tiny_pool_completes(specs):
    engine = make_engine(num_blocks=NUM_BLOCKS, max_batched_tokens=64)
    aborts = {}
    for request_id, (base, length, max_tokens, n, abort_at) in enumerate(specs):
        engine.add_request(request_id, request(BASES[base][:length], max_tokens, n=n))
        if abort_at is not None:
            aborts.setdefault(abort_at, []).append(request_id)
    results: dict = {}
    for step in range(MAX_STEPS):
        for request_id in aborts.pop(step, []):
            engine.abort_request(request_id)
        if not engine.has_work():
            break
        collect(engine.step(), results)
        engine.manager.check_invariants()
    assert not engine.has_work(), "requests did not finish in bounded steps"
    assert engine.scheduler.num_stalls == 0
    for request_id, (_, _, max_tokens, n, abort_at) in enumerate(specs):
        if abort_at is None:
            tokens = results[request_id].token_ids
            assert sorted(tokens) == list(range(n))
            assert all(len(ids) == max_tokens for ids in tokens.values())
    stats = engine.manager.stats()
    assert stats.num_used_blocks == 0
    engine.manager.prefix_cache.evict(NUM_BLOCKS)
    assert engine.manager.num_free_blocks == NUM_BLOCKS, "every cached block is evictable"


def test_second_long_prompt_after_a_mid_block_hit_runs_and_hits():
    """The issue's reproduction in the engine: two 9-block prompts on a 12-block pool
    share 37 tokens (a hit ending inside block 2); the second must evict the first's
    unshared cached blocks, so the hit may pin only the two whole shared blocks."""
    engine = make_engine(num_blocks=NUM_BLOCKS, max_batched_tokens=64)
    first, second = BASES[0][: 9 * BLOCK_SIZE - 10], BASES[1][: 9 * BLOCK_SIZE - 10]
    results: dict = {}
    for request_id, prompt_ids in enumerate((first, second)):
        engine.add_request(request_id, request(prompt_ids, max_tokens=1))
        for _ in range(MAX_STEPS):
            if not engine.has_work():
                break
            collect(engine.step(), results)
            engine.manager.check_invariants()
        assert not engine.has_work(), f"request {request_id} did not finish"
    assert results[1].usage.cached_tokens == 37
    assert engine.scheduler.num_stalls == 0
