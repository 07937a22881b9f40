"""The canary's parts in process: sticky weighted pools, guard windows, the probe's
comparison, and the guard loop that drains a pool (real asyncio, real metrics)."""

from __future__ import annotations

import asyncio
import collections
import logging
import time

import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from harness import instant_upstream
from radix.keys import to_key
from router.canary.controller import Canary
from router.canary.guards import GuardWindow, WindowSummary, judge
from router.canary.pools import ModelPools, Trip
from router.canary.probe import Answer, divergences
from router.config import CanaryConfig, ModelSpec, PoolConfig
from tests.support.aio import eventually, running_router, serving
from tests.support.router_configs import make_config

SECRET = b"canary-test-secret"
BLOCK_SIZE = 4
NAMES = ("baseline", "fp8", "other")


def make_pools(weights: dict[str, float]) -> ModelPools:
    configs = {name: PoolConfig(workers=(f"w-{name}",), weight=w) for name, w in weights.items()}
    return ModelPools("demo", configs, "baseline", BLOCK_SIZE, SECRET)


def conversation(i: int, num_turns: int = 1) -> bytes:
    """A prompt whose first block is the conversation's own, growing by turn."""
    return to_key([i % 251, i // 251, 7, 7] + [1, 2, 3] * num_turns)


def test_a_conversation_stays_on_its_pool_as_it_grows() -> None:
    pools = make_pools({"baseline": 50, "fp8": 50})
    for i in range(200):
        first = pools.pick("alice", conversation(i))
        assert all(pools.pick("alice", conversation(i, turns)) == first for turns in (2, 5, 9))
    assert {pools.pick("alice", conversation(i)) for i in range(200)} == {"baseline", "fp8"}


def test_conversations_spread_by_weight_and_tenant() -> None:
    pools = make_pools({"baseline": 95, "fp8": 5})
    counts = collections.Counter(pools.pick(tenant, conversation(i))
                                 for tenant in ("alice", "bob") for i in range(20_000))
    assert 0.04 < counts["fp8"] / 40_000 < 0.06
    differ = sum(pools.pick("alice", conversation(i)) != pools.pick("bob", conversation(i))
                 for i in range(20_000))
    assert differ > 0


@given(st.lists(st.integers(0, 100), min_size=3, max_size=3).filter(sum),
       st.sampled_from(NAMES), st.integers(1, 100))
def test_raising_a_weight_only_moves_conversations_to_that_pool(weights: list[int], pool: str,
                                                                raise_by: int) -> None:
    before = dict(zip(NAMES, weights, strict=True))
    old_pools, new_pools = make_pools(before), make_pools({**before, pool: before[pool] + raise_by})
    for i in range(300):
        old, new = old_pools.pick("t", conversation(i)), new_pools.pick("t", conversation(i))
        assert new in (old, pool)
        assert before[new] or new == pool


def test_a_tripped_pool_takes_no_conversation_until_re_enabled() -> None:
    pools = make_pools({"baseline": 50, "fp8": 30, "other": 20})
    trip = Trip("probe", "prompt 0 differs at token 3")
    assert not pools.trip("baseline", trip)
    assert pools.trip("fp8", trip) and not pools.trip("fp8", trip)
    assert pools.weights == {"baseline": 50, "fp8": 0, "other": 20}
    assert pools.trips == {"fp8": trip}
    assert "fp8" not in {pools.pick("alice", conversation(i)) for i in range(2000)}
    pools.set_weights({"fp8": 5})
    assert pools.trips == {} and pools.weights["fp8"] == 5
    assert "fp8" in {pools.pick("alice", conversation(i)) for i in range(2000)}


OUT_OF_RANGE = r"weights.fp8: must be a number in \[0, 1e\+06\]"


@pytest.mark.parametrize(("weights", "message"), [
    ({"nope": 1}, "weights.nope: no such pool"),
    ({"fp8": -1}, OUT_OF_RANGE),
    ({"fp8": "5"}, OUT_OF_RANGE),
    ({"fp8": True}, OUT_OF_RANGE),
    ({"fp8": float("nan")}, OUT_OF_RANGE),
    ({"fp8": 10**400}, OUT_OF_RANGE),
    ({"fp8": 2e6}, OUT_OF_RANGE),
    ({"baseline": 0, "fp8": 0}, "weights: at least one pool needs a weight above 0"),
])
def test_bad_weights_are_refused_and_change_nothing(weights: dict, message: str) -> None:
    pools = make_pools({"baseline": 90, "fp8": 10})
    with pytest.raises(ValueError, match=message):
        pools.set_weights(weights)
    assert pools.weights == {"baseline": 90, "fp8": 10}


class Worker:
    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id


def test_split_falls_back_to_the_baseline() -> None:
    pools = make_pools({"baseline": 0.001, "fp8": 1000})
    base, fp8, extra = Worker("w-baseline"), Worker("w-fp8"), Worker("added-at-run-time")
    assert pools.split([base, fp8, extra], "alice", conversation(1)) == ("fp8", [fp8],
                                                                         [base, extra])
    assert pools.split([base, extra], "alice", conversation(1)) == ("baseline", [base, extra], [])
    pools.set_weights({"baseline": 1, "fp8": 0})
    assert pools.split([base, fp8], "alice", conversation(1)) == ("baseline", [base], [])


def test_window_forgets_old_outcomes_and_takes_the_nearest_rank_p99() -> None:
    window = GuardWindow(window_s=10)
    for i in range(100):
        window.record(float(i) / 10, i % 10 == 0, float(i))
    window.record(9.9, True, None)
    assert window.summary(9.9) == WindowSummary(101, 11, 98.0)
    assert window.summary(15.0) == WindowSummary(51, 6, 99.0)
    assert window.summary(25.0) == WindowSummary(0, 0, None)
    window.record(26.0, False, 0.5)
    window.clear()
    assert window.summary(26.0).num_requests == 0


def test_window_keeps_the_latest_outcomes_only() -> None:
    window = GuardWindow(window_s=60, max_outcomes=10)
    for i in range(25):
        window.record(float(i), i < 20, float(i))
    assert window.summary(25.0) == WindowSummary(10, 5, 24.0)


def test_judge_needs_enough_requests_then_trips_on_errors_before_ttft() -> None:
    config = CanaryConfig(min_requests=10, max_error_rate=0.1, max_ttft_p99_s=2.0)
    assert judge(WindowSummary(9, 9, 9.0), config) is None
    assert judge(WindowSummary(10, 1, 2.0), config) is None
    assert judge(WindowSummary(10, 2, 9.0), config).reason == "error_rate"
    assert judge(WindowSummary(10, 1, 2.5), config) == Trip(
        "ttft_p99", "TTFT p99 2.500 s over 10 requests (above 2 s)")
    off = CanaryConfig(min_requests=1, max_error_rate=None, max_ttft_p99_s=None)
    assert judge(WindowSummary(10, 10, 99.0), off) is None


def answers(*token_ids: tuple[int, ...]) -> tuple[Answer, ...]:
    return tuple(Answer(ids, "") for ids in token_ids)


def test_divergences_name_the_prompt_and_the_first_differing_token() -> None:
    baseline = answers((1, 2, 3), (4, 5, 6), (7, 8))
    assert divergences(baseline, baseline) == []
    assert divergences(baseline, answers((1, 2, 3), (4, 9, 6), (7, 8, 9))) == [
        "prompt 1 differs at token 1", "prompt 2 differs at token 2"]


def test_text_is_compared_where_a_side_has_no_token_ids() -> None:
    baseline = (Answer((1, 2), "ab"), Answer((3,), "cd"))
    text_only = (Answer(None, "ab"), Answer(None, "cx"))
    assert divergences(baseline, text_only) == ["prompt 1 differs at character 1"]
    assert divergences(text_only, (Answer((9, 9), "ab"), Answer((3,), "cx"))) == []


def canary(registry: CollectorRegistry, **guards: object) -> Canary:
    config = CanaryConfig(check_interval_s=0.01, probe_interval_s=3600, min_requests=4,
                          **guards)  # type: ignore[arg-type]
    pools = {"baseline": PoolConfig(workers=("w0",), weight=90),
             "fp8": PoolConfig(workers=("w1",), weight=10)}
    models = {"demo": ModelSpec(name="demo", tokenizer="demo", pools=pools, canary=config),
              "plain": ModelSpec(name="plain", tokenizer="demo")}
    return Canary(models, SECRET, lambda model, text: list(text.encode()), registry)


def metrics_text(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def test_every_fallback_series_exists_from_the_start() -> None:
    registry = CollectorRegistry()
    guarded = canary(registry)
    text = metrics_text(registry)
    assert 'router_pool_weight{model="demo",pool="fp8"} 10.0' in text
    for reason in ("error_rate", "ttft_p99", "probe"):
        assert (f'router_canary_fallbacks_total{{model="demo",pool="fp8",reason="{reason}"}} 0.0'
                in text)
    assert 'pool="baseline",reason' not in text
    assert guarded.route("plain", [], "alice", b"") is None


@pytest.mark.anyio
@pytest.mark.parametrize(("ttft_s", "code", "reason"), [(0.1, 502, "error_rate"),
                                                        (5.0, 200, "ttft_p99")])
async def test_a_guard_drains_its_pool_at_once(caplog, ttft_s: float, code: int,
                                               reason: str) -> None:
    registry = CollectorRegistry()
    guarded = canary(registry, max_error_rate=0.5, max_ttft_p99_s=1.0)
    workers = [Worker("w0"), Worker("w1")]
    key = next(conversation(i) for i in range(1000)
               if guarded.route("demo", workers, "alice", conversation(i)).fallback)
    guarded.start(lambda model: [], None)  # type: ignore[arg-type]
    try:
        with caplog.at_level(logging.WARNING, logger="router.canary.controller"):
            for _ in range(4):
                route = guarded.route("demo", workers, "alice", key)
                assert route.workers == [workers[1]]
                route.window.record(time.monotonic(), code >= 500, ttft_s)
            for _ in range(100):
                if guarded.route("demo", workers, "alice", key).workers == [workers[0]]:
                    break
                await asyncio.sleep(0.01)
    finally:
        await guarded.close()
    state = guarded.to_dict()["demo"]["pools"]["fp8"]
    assert state["weight"] == 0 and state["tripped"]["reason"] == reason
    assert f"model demo pool fp8 -> weight 0, new requests go to baseline: {reason}" in caplog.text
    text = metrics_text(registry)
    assert f'router_canary_fallbacks_total{{model="demo",pool="fp8",reason="{reason}"}} 1.0' in text
    assert 'router_pool_weight{model="demo",pool="fp8"} 0.0' in text


@pytest.mark.parametrize("state", [
    None, {}, {"weights": []}, {"weights": {"nope": 1}}, {"weights": {"fp8": -1}},
    {"weights": {"baseline": 0, "fp8": 0}}, {"weights": {}, "trips": {"fp8": "bad"}},
    {"weights": {"fp8": 0}, "trips": {"nope": ["probe", "x"]}},
])
def test_a_shared_state_this_router_cannot_use_changes_nothing(state: object) -> None:
    registry = CollectorRegistry()
    guarded = canary(registry)
    before = guarded.shared_state("demo")
    with pytest.raises(ValueError):
        guarded.adopt("demo", state)
    assert guarded.shared_state("demo") == before
    assert 'router_pool_weight{model="demo",pool="fp8"} 10.0' in metrics_text(registry)


def test_an_adopted_state_sets_weights_trips_and_metrics_and_ignores_other_models() -> None:
    registry = CollectorRegistry()
    guarded = canary(registry)
    tripped = {"weights": {"baseline": 90, "fp8": 0}, "trips": {"fp8": ["probe", "2 of 4"]}}
    assert guarded.adopt("demo", tripped) and not guarded.adopt("demo", tripped)
    assert guarded.shared_state("demo") == tripped
    assert guarded.to_dict()["demo"]["pools"]["fp8"]["tripped"] == {"reason": "probe",
                                                                     "detail": "2 of 4"}
    assert 'router_pool_weight{model="demo",pool="fp8"} 0.0' in metrics_text(registry)
    assert guarded.adopt("demo", {"weights": {"fp8": 5}, "trips": {"fp8": ["probe", "x"]}})
    assert guarded.shared_state("demo") == {"weights": {"baseline": 90, "fp8": 5}, "trips": {}}
    assert not guarded.adopt("plain", tripped) and not guarded.adopt("unknown", tripped)


def other_text_upstream() -> web.Application:
    """An OpenAI server whose completions are other text than the instant upstream's."""
    async def complete(request: web.Request) -> web.Response:
        num_tokens = (await request.json())["max_tokens"]
        return web.json_response({"object": "text_completion", "model": "demo", "choices": [
            {"index": 0, "text": "b" * num_tokens, "finish_reason": "length"}], "usage": {
            "prompt_tokens": 1, "completion_tokens": num_tokens,
            "prompt_tokens_details": {"cached_tokens": 0}}})

    app = web.Application()
    app.add_routes([*instant_upstream.status_routes(), web.get("/v1/models", instant_upstream.models),
                    web.post("/v1/completions", complete)])
    return app


@pytest.mark.anyio
async def test_pools_of_openai_workers_are_probed_through_their_completions() -> None:
    pools = {"pools": {"baseline": {"workers": ["u0"], "weight": 1},
                       "same": {"workers": ["u1"], "weight": 1},
                       "other": {"workers": ["u2"], "weight": 1}},
             "canary": {"probe_interval_s": 0.2, "check_interval_s": 0.1}}
    async with serving(instant_upstream.create_app("base")) as base, \
            serving(instant_upstream.create_app("same")) as same, \
            serving(other_text_upstream()) as other, \
            running_router(make_config([base, same, other], kind="openai", model=pools)) as (_, r):
        state = await eventually(lambda: (p := r.canary.to_dict()["demo"]["pools"])[
            "other"]["tripped"] and p["same"]["last_probe"] and p, 5.0)
    assert state["other"]["weight"] == 0
    assert "prompt 0 differs at character 0" in state["other"]["tripped"]["detail"]
    assert state["same"]["last_probe"] == "agree" and state["same"]["weight"] == 1
