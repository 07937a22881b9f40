"""Preemption (by recompute, or by swapping to the host tier) when the KV cache runs
out, and its invariants."""

from __future__ import annotations

import pytest

from tests.workers.engine.engine_support import make_engine, prompt, request, run


def workload() -> dict:
    """4 sequences of up to 24 + 24 tokens (3 blocks each): 12 blocks at the peak;
    odd ones sampled with a seed, even ones greedy."""
    return {
        i: request(prompt(24, salt=i), max_tokens=24, temperature=1.0 if i % 2 else 0.0, seed=i)
        for i in range(4)
    }


def test_preempted_requests_complete_with_the_same_tokens():
    reference = run(make_engine(), workload())
    tiny = make_engine(num_blocks=7)
    results = run(tiny, workload())
    assert tiny.scheduler.num_preemptions > 0
    assert tiny.stats().preemptions_total == tiny.scheduler.num_preemptions
    for i in range(4):
        assert results[i].token_ids == reference[i].token_ids, f"request {i}"
        assert results[i].usage.completion_tokens == 24


def test_swapped_out_requests_come_back_from_the_host_tier_with_the_same_tokens():
    reference = run(make_engine(), workload())
    tiny = make_engine(num_blocks=7, num_host_blocks=32, preemption_mode="swap")
    results = run(tiny, workload())
    stats = tiny.stats()
    assert stats.preemption_swaps_total == stats.preemptions_total > 0
    assert stats.kv_host_hit_blocks_total > 0 and stats.kv_host_auth_failures_total == 0
    assert stats.kv_host_bytes_to_device_total > 0
    for i in range(4):
        assert results[i].token_ids == reference[i].token_ids, f"request {i}"
    tiny.manager.check_invariants()


def test_newest_sequence_is_preempted_and_requeued_first():
    engine = make_engine(num_blocks=5)
    engine.add_request(0, request(prompt(24), max_tokens=40))
    engine.add_request(1, request(prompt(24, salt=1), max_tokens=40))
    while engine.scheduler.num_preemptions == 0:
        engine.step()
        engine.manager.check_invariants()
    victim = engine.scheduler.waiting[0]
    assert victim.request.request_id == 1
    assert engine.scheduler.num_uncomputed_tokens(victim) == len(victim.token_ids)
    with pytest.raises(KeyError):  # a preempted sequence has no KV count at all
        engine.manager.num_computed_tokens(victim.seq_id)
    assert [s.request.request_id for s in engine.scheduler.running] == [0]
    results = run(engine, {})
    assert results[1].finish_reason[0] == "length"
