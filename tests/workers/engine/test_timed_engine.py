"""The timed backend: its step costs worked by hand, repeatable outputs, and KV
behaviour identical to the demo model's on the same trace."""

from __future__ import annotations

import pytest

from radix.cost_model import PROFILES, CostModel, get_profile
from tests.workers.engine.engine_support import make_engine, prompt, request, run
from workers.build import build_worker
from workers.config import KVSettings, ModelSettings, WorkerConfig
from workers.kv.plan import plan_kv_cache
from workers.model.step_input import StepInput
from workers.model.timed import (
    TimedRunner,
    timed_kv_spec,
    timed_link_s_per_block,
    timed_profile,
)

COST = CostModel(a=0.004, b=3e-5, c=1e-9, d=0.007, e=2e-5, f=5e-8)


def test_a_prefill_chunk_and_a_decode_step_cost_what_the_formulas_say():
    # 100 new tokens over 100 of context: 0.004 + 100 * 3e-5 + 100 * 100 * 1e-9.
    assert COST.prefill_chunk_s(100, 100) == pytest.approx(0.00701, rel=1e-12)
    # 4 sequences whose contexts sum to 410: 0.007 + 4 * 2e-5 + 410 * 5e-8.
    assert COST.decode_step_s(4, 410) == pytest.approx(0.0071005, rel=1e-12)
    assert COST.decode_step_s(0, 0) == 0.0
    # A mixed step is the sum of its parts; one-token entries are decodes.
    mixed = COST.step_s([(100, 100), (1, 200), (1, 210)])
    assert mixed == pytest.approx(0.00701 + 0.007 + 2 * 2e-5 + 410 * 5e-8, rel=1e-12)


def test_the_runner_waits_each_steps_cost_and_chooses_the_same_tokens_every_time():
    waits: list[float] = []
    runner = TimedRunner(COST, 300, range(97, 123), sleep=waits.append)
    batch = [StepInput([5] * 40, 60, []), StepInput([9], 99, [])]
    first = runner.execute(batch).argmax(dim=1).tolist()
    again = TimedRunner(COST, 300, range(97, 123), sleep=waits.append).execute(batch[::-1])
    # 40 new over 100 of context, then one decode over 100: worked by hand.
    expected_s = (0.004 + 40 * 3e-5 + 40 * 100 * 1e-9) + (0.007 + 2e-5 + 100 * 5e-8)
    assert waits == [pytest.approx(expected_s, rel=1e-12)] * 2
    assert again.argmax(dim=1).tolist() == first[::-1]  # a row never depends on its batch
    assert all(97 <= token < 123 for token in first)


def test_an_engine_run_waits_exactly_the_chunked_prefill_and_decode_costs():
    waits: list[float] = []
    engine = make_engine(num_blocks=16, max_batched_tokens=32, timed=COST, sleep=waits.append)
    results = run(engine, {0: request(prompt(40), max_tokens=3)})
    assert len(results[0].token_ids[0]) == 3
    assert waits == pytest.approx([
        0.004 + 32 * 3e-5 + 32 * 32 * 1e-9,  # chunk 1: tokens 0-31
        0.004 + 8 * 3e-5 + 8 * 40 * 1e-9,    # chunk 2: tokens 32-39, samples token 1
        0.007 + 2e-5 + 41 * 5e-8,            # decode: token 2
        0.007 + 2e-5 + 42 * 5e-8,            # decode: token 3
    ], rel=1e-12)


def test_a_cached_prefix_is_context_not_new_tokens():
    waits: list[float] = []
    engine = make_engine(num_blocks=16, timed=COST, sleep=waits.append)
    run(engine, {0: request(prompt(40), max_tokens=1)})
    waits.clear()
    results = run(engine, {1: request(prompt(40)[:32] + (1, 2, 3, 4, 5), max_tokens=1)})
    assert results[1].usage.cached_tokens == 32
    assert waits == [pytest.approx(0.004 + 5 * 3e-5 + 5 * 37 * 1e-9, rel=1e-12)]


def _trace() -> dict:
    """Shared prefixes (hits, copy-on-write of a partial block), long prompts that
    overflow 14 blocks (eviction, preemption), greedy, outputs of several tokens."""
    base = prompt(50)
    return {
        0: request(base, max_tokens=6),
        1: request(base[:37] + prompt(20, salt=1), max_tokens=9),
        2: request(prompt(120, salt=2), max_tokens=12),
        3: request(base + prompt(30, salt=3), max_tokens=5),
        4: request(prompt(90, salt=4), max_tokens=20, n=2),
    }


def _kv_record(max_tokens: int | None, timed: bool):
    engine = make_engine(num_blocks=14, max_batched_tokens=64, timed=COST if timed else None,
                         sleep=lambda s: None)
    trace = _trace()
    if max_tokens is not None:
        trace = {i: request(r.prompt_token_ids, max_tokens=max_tokens) for i, r in trace.items()}
    results = {}
    for i, req in trace.items():  # two waves: the second meets the first's cache
        results.update(run(engine, {i: req}) if i in (0, 3) else {})
        if i not in (0, 3):
            engine.add_request(i, req)
    results.update(run(engine, {}))
    log = engine.manager.event_log
    events = log.since(0, log.epoch)
    cached = {i: r.usage.cached_tokens for i, r in sorted(results.items())}
    return events, cached, engine.scheduler.num_preemptions, engine.stats().cow_copies_total


def test_kv_behaviour_matches_the_demo_model_event_for_event():
    # One output token is never computed, so only prompts reach the cache: the event
    # logs must be equal to the hash.
    demo_events, demo_cached, demo_preempted, _ = _kv_record(1, timed=False)
    timed_events, timed_cached, timed_preempted, _ = _kv_record(1, timed=True)
    assert [(e.seq, e.type, e.scope, e.blocks) for e in timed_events] == [
        (e.seq, e.type, e.scope, e.blocks) for e in demo_events]
    assert timed_cached == demo_cached and any(demo_cached.values())
    assert timed_preempted == demo_preempted


def test_kv_behaviour_with_outputs_matches_the_demo_model_block_for_block():
    # Outputs differ (their tokens come from another generator), so blocks holding them
    # hash differently; everything else (which blocks, when, hits, preemptions,
    # copy-on-write) must not.
    demo = _kv_record(None, timed=False)
    timed = _kv_record(None, timed=True)

    def shape(events):
        return [(e.seq, e.type, e.scope, [len(b.tokens or ()) for b in e.blocks]) for e in events]

    assert shape(timed[0]) == shape(demo[0])
    assert timed[1:] == demo[1:]
    assert demo[2] > 0 and demo[3] > 0, "the trace must preempt and copy on write"


@pytest.mark.parametrize("name", list(PROFILES))
def test_a_profile_plans_its_kv_capacity_with_the_worker_formula(name):
    profile = timed_profile(f"timed:{name}")
    assert profile is get_profile(name)
    spec = timed_kv_spec(profile, 16)
    assert spec.kv_bytes_per_token == 2 * profile.num_layers * profile.num_kv_heads * 128 * 2
    plan = plan_kv_cache(spec, profile.kv_cache_bytes)
    assert plan.num_blocks == int(profile.kv_cache_bytes * 0.98) // spec.kv_bytes_per_block


def test_unknown_profiles_and_plain_names():
    assert timed_profile("demo") is None
    with pytest.raises(ValueError, match="llama3-8b-h100"):
        timed_profile("timed:nope")


def test_a_pulled_block_waits_its_real_bytes_over_the_profile_link():
    profile = get_profile("llama3-8b-h100")  # 32 layers x 8 KV heads x 128 x bf16, K and V
    block_bytes = 16 * 32 * 8 * 128 * 2 * 2
    assert timed_link_s_per_block(profile, 16, 1.0) == pytest.approx(block_bytes / 50e9)
    assert timed_link_s_per_block(profile, 16, 20.0) == pytest.approx(20 * block_bytes / 50e9)


def test_a_timed_worker_plans_kv_timed_cache_bytes_when_set():
    def plan(**kv: object):
        config = WorkerConfig(model=ModelSettings(name="timed:llama3-8b-h100"),
                              kv=KVSettings(**kv))  # type: ignore[arg-type]
        return build_worker(config, "w", b"secret").identity.kv_plan

    profile = get_profile("llama3-8b-h100")
    assert plan().kv_cache_bytes == profile.kv_cache_bytes
    small = plan(timed_cache_bytes=2**30)  # 8,192 tokens of 128 KiB
    assert small.kv_cache_bytes == 2**30 and small.num_tokens <= 8192
