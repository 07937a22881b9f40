"""Engine scheduling in-process: chunked prefill, batched decode, admission, forks."""

from __future__ import annotations

import pytest

from tests.workers.engine.engine_support import (
    BLOCK_SIZE,
    Result,
    collect,
    make_engine,
    prompt,
    request,
    run,
)
from workers.engine.sequence import SequenceStatus


def test_long_prompt_is_prefilled_in_chunks_then_decoded():
    engine = make_engine(max_batched_tokens=32)
    engine.add_request(0, request(prompt(100), max_tokens=3))
    computed = []
    for _ in range(3):
        assert engine.step() == {}, "no token before the prompt is fully computed"
        computed.append(engine.manager.num_computed_tokens(engine.scheduler.running[0].seq_id))
    outputs = engine.step()
    seq = engine.scheduler.running[0]
    assert computed == [32, 64, 96] and engine.manager.num_computed_tokens(seq.seq_id) == 100
    assert engine.scheduler.num_uncomputed_tokens(seq) == 1
    assert len(outputs[0].deltas[0].token_ids) == 1 and len(seq.token_ids) == 101
    assert set(engine.step()) == {0}, "then one decode step per token"


def test_chunked_and_unchunked_prefill_agree():
    small = run(make_engine(max_batched_tokens=24), {0: request(prompt(90), max_tokens=6)})
    large = run(make_engine(max_batched_tokens=512), {0: request(prompt(90), max_tokens=6)})
    assert small[0].token_ids == large[0].token_ids
    assert len(small[0].token_ids[0]) == 6


def test_decodes_batch_together_and_go_before_prefill_chunks():
    engine = make_engine(max_batched_tokens=40)
    for request_id in range(3):
        engine.add_request(request_id, request(prompt(10, salt=request_id), max_tokens=20))
    assert set(engine.step()) == {0, 1, 2}, "three 10-token prompts fit one 40-token step"
    engine.add_request(3, request(prompt(200, salt=3), max_tokens=2))
    chunks = engine.scheduler.schedule()
    assert [(c.seq.request.request_id, c.num_new_tokens) for c in chunks] == [
        (0, 1), (1, 1), (2, 1), (3, 37)
    ]


def test_waiting_request_is_admitted_when_blocks_free_up():
    engine = make_engine(num_blocks=8)
    engine.add_request(0, request(prompt(90), max_tokens=4))  # 6 blocks, then a 7th
    engine.add_request(1, request(prompt(60, salt=1), max_tokens=4))  # 4 blocks
    results: dict[int, Result] = {}
    collect(engine.step(), results)
    assert [s.request.request_id for s in engine.scheduler.running] == [0]
    assert [s.request.request_id for s in engine.scheduler.waiting] == [1]
    assert engine.scheduler.waiting[0].status is SequenceStatus.WAITING
    assert engine.stats().num_requests_waiting == 1
    assert engine.stats().num_waiting_tokens == 60
    run(engine, {}, results)
    assert [len(results[i].token_ids[0]) for i in (0, 1)] == [4, 4]
    assert engine.scheduler.num_preemptions == 0


def test_prefix_cache_hit_is_reported_and_null_cache_reports_none():
    shared = prompt(64)
    first = request(shared + (1, 2, 3), max_tokens=4)
    second = request(shared + (4, 5, 6, 7), max_tokens=4)
    engine = make_engine()
    run(engine, {0: first})
    usage = run(engine, {1: second})[1].usage
    assert usage is not None and usage.cached_tokens == 64 and usage.prompt_tokens == 68
    stats = engine.stats()
    assert stats.prefix_cache_hit_tokens_total == 64
    null = make_engine(prefix_caching=False)
    run(null, {0: first})
    assert run(null, {1: second})[1].usage.cached_tokens == 0


def test_fork_shares_the_prompt_and_each_choice_follows_its_seed():
    engine = make_engine()
    forked = run(engine, {0: request(prompt(40), max_tokens=6, temperature=1.0, seed=5, n=3)})[0]
    assert sorted(forked.token_ids) == [0, 1, 2]
    assert forked.usage.completion_tokens == 18
    assert engine.stats().cow_copies_total >= 2, "children copy the shared partial block"
    for index in range(3):
        single = run(make_engine(), {0: request(prompt(40), max_tokens=6, temperature=1.0, seed=5 + index)})
        assert single[0].token_ids[0] == forked.token_ids[index]
    assert len({tuple(tokens) for tokens in forked.token_ids.values()}) > 1


def test_abort_releases_every_block_at_once():
    engine = make_engine()
    engine.add_request(0, request(prompt(50), max_tokens=100, n=2))
    engine.add_request(1, request(prompt(30, salt=1), max_tokens=100))
    for _ in range(3):
        engine.step()
    assert engine.manager.stats().num_used_blocks > 0
    engine.abort_request(0)
    engine.abort_request(1)
    engine.abort_request(7)  # unknown: no-op
    engine.manager.check_invariants()
    stats = engine.manager.stats()
    assert stats.num_used_blocks == 0
    assert stats.num_cached_blocks >= (50 + 30) // BLOCK_SIZE, "computed tokens stay cached"
    assert not engine.has_work()


def test_a_failed_batch_caches_only_the_positions_written_before_it():
    engine = make_engine(max_batched_tokens=16)
    engine.add_request(0, request(prompt(40), max_tokens=3))
    engine.step()  # 16 prompt tokens computed and committed
    seq = engine.scheduler.running[0]

    def fail(inputs):
        raise RuntimeError("device fault")

    engine._runner.execute = fail
    with pytest.raises(RuntimeError) as failed:
        engine.step()  # positions 16..31 were assigned, never written
    assert engine.manager.num_computed_tokens(seq.seq_id) == 32
    assert engine.scheduler.num_written_tokens(seq) == 16
    assert engine.fail_step(failed.value) == [0]
    assert engine.manager.stats().num_cached_tokens == 16
    engine.manager.check_invariants()
