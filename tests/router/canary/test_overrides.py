"""Canary weights set with ``ttl_s`` go back by themselves: the bookkeeping against a
brute-force model (every pool replayed second by second), and the canary in process
(real asyncio): the weights go back, the admin log says what, to what and who set
it, and the change is published like any other."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from router.canary.controller import Canary
from router.canary.overrides import PendingOverrides, SetBy
from router.config import CanaryConfig, ModelSpec, PoolConfig

ALICE = SetBy("ops-alice", "req-1")
BOB = SetBy("ops-bob", "req-2")
POOLS = ("fp8", "other")


def test_an_override_goes_back_at_its_deadline_and_not_before() -> None:
    pending = PendingOverrides()
    pending.record({"fp8": 5.0}, {"fp8": 50.0}, 60.0, 100.0, ALICE)
    assert pending.next_deadline() == 160.0
    assert pending.to_dict("fp8", 130.0) == {"weight": 50.0, "revert_to": 5.0, "ttl_s": 60.0,
                                             "expires_in_s": 30.0, "set_by": "ops-alice",
                                             "request_id": "req-1"}
    assert pending.expire(159.9, {"fp8": 50.0}).reverted == {}
    expiry = pending.expire(160.0, {"fp8": 50.0})
    assert expiry.weights == {"fp8": 5.0} and list(expiry.reverted) == ["fp8"]
    assert pending.next_deadline() is None and pending.to_dict("fp8", 160.0) is None


def test_a_pool_changed_since_keeps_its_weight() -> None:
    pending = PendingOverrides()
    pending.record({"fp8": 5.0, "other": 1.0}, {"fp8": 50.0, "other": 2.0}, 10.0, 0.0, ALICE)
    expiry = pending.expire(10.0, {"fp8": 0.0, "other": 2.0})  # a guard tripped fp8
    assert expiry.weights == {"other": 1.0}
    assert list(expiry.kept) == ["fp8"] and list(expiry.reverted) == ["other"]


def test_a_chain_of_overrides_ends_where_it_began_and_a_lasting_change_ends_it() -> None:
    pending = PendingOverrides()
    pending.record({"fp8": 5.0}, {"fp8": 50.0}, 10.0, 0.0, ALICE)
    pending.record({"fp8": 50.0}, {"fp8": 70.0}, 10.0, 5.0, BOB)
    assert pending.expire(10.0, {"fp8": 70.0}).weights == {}  # the first is superseded
    expiry = pending.expire(15.0, {"fp8": 70.0})
    assert expiry.weights == {"fp8": 5.0} and expiry.reverted["fp8"].set_by == BOB
    pending.record({"fp8": 5.0}, {"fp8": 50.0}, 10.0, 20.0, ALICE)
    pending.record({"fp8": 50.0}, {"fp8": 60.0}, None, 21.0, BOB)
    assert pending.next_deadline() is None


# One step: (second, pool, weight, ttl_s or None for good, by an admin or not).
STEPS = st.lists(st.tuples(st.integers(0, 30), st.sampled_from(POOLS), st.integers(0, 9),
                           st.one_of(st.none(), st.integers(1, 10)), st.booleans()),
                 max_size=12)


def brute_force(steps: list[tuple[int, str, int, int | None, bool]], end: int
                ) -> dict[str, float]:
    """Every pool replayed second by second: a temporary admin weight goes back at
    its deadline to the weight before the temporary ones that followed each other
    unchanged; any later change of the pool ends it."""
    weights = {pool: 1.0 for pool in POOLS}
    temporary: dict[str, tuple[float, float, int]] = {}  # pool -> (set, back to, deadline)
    for second in range(end + 1):
        for pool, (weight, back_to, deadline) in list(temporary.items()):
            if deadline <= second:
                del temporary[pool]
                if weights[pool] == weight:
                    weights[pool] = back_to
        for at, pool, weight, ttl_s, by_admin in steps:
            if at != second:
                continue
            if by_admin and ttl_s is not None:
                earlier = temporary.get(pool)
                back_to = (earlier[1] if earlier and earlier[0] == weights[pool]
                           else weights[pool])
                temporary[pool] = (float(weight), back_to, second + ttl_s)
            elif by_admin:
                temporary.pop(pool, None)
            weights[pool] = float(weight)
    return weights


@given(STEPS)
def test_pending_overrides_match_the_brute_force_model(steps) -> None:
    steps = sorted(steps, key=lambda step: step[0])
    pending, weights = PendingOverrides(), {pool: 1.0 for pool in POOLS}
    for second in range(50):
        weights.update(pending.expire(float(second), weights).weights)
        for at, pool, weight, ttl_s, by_admin in steps:
            if at == second:
                if by_admin:
                    pending.record(weights, {pool: float(weight)},
                                   None if ttl_s is None else float(ttl_s), float(second), ALICE)
                weights[pool] = float(weight)
    assert weights == brute_force(steps, 49)


def canary(registry: CollectorRegistry) -> Canary:
    pools = {"baseline": PoolConfig(workers=("w0",), weight=90),
             "fp8": PoolConfig(workers=("w1",), weight=10)}
    config = CanaryConfig(check_interval_s=3600, probe_interval_s=3600)
    models = {"demo": ModelSpec(name="demo", tokenizer="demo", pools=pools, canary=config)}
    return Canary(models, b"secret", lambda model, text: list(text.encode()), registry)


@pytest.mark.anyio
async def test_a_canary_override_goes_back_by_itself_logged_and_published(caplog) -> None:
    registry, published = CollectorRegistry(), []
    guarded = canary(registry)

    async def publish(model: str, state: dict[str, Any]) -> None:
        published.append((model, state))

    guarded.start(lambda model: [], None, publish)  # type: ignore[arg-type]
    try:
        with caplog.at_level(logging.INFO, logger="router.admin"):
            assert guarded.set_weights("demo", {"fp8": 50}, ALICE, ttl_s=0.2) == {
                "baseline": 90, "fp8": 50}
            override = guarded.to_dict()["demo"]["pools"]["fp8"]["override"]  # type: ignore[index]
            assert override["revert_to"] == 10 and override["set_by"] == "ops-alice"
            for _ in range(100):
                if not published:
                    await asyncio.sleep(0.02)
    finally:
        await guarded.close()
    assert published == [("demo", {"weights": {"baseline": 90, "fp8": 10}, "trips": {}})]
    assert guarded.to_dict()["demo"]["pools"]["fp8"]["override"] is None  # type: ignore[index]
    assert 'router_pool_weight{model="demo",pool="fp8"} 10.0' in generate_latest(
        registry).decode()
    assert ("admin override expired: model demo pool fp8: weight 50 -> 10 (set by key "
            "ops-alice, request req-1, for 0.2 s)") in caplog.text


@pytest.mark.anyio
async def test_going_back_to_no_traffic_is_refused_and_logged(caplog) -> None:
    guarded = canary(CollectorRegistry())
    try:
        with caplog.at_level(logging.INFO, logger="router.admin"):
            guarded.set_weights("demo", {"fp8": 0}, ALICE)
            guarded.set_weights("demo", {"fp8": 10}, ALICE, ttl_s=0.1)  # back to 0...
            guarded.set_weights("demo", {"baseline": 0}, BOB)  # ...would leave no pool
            await asyncio.sleep(0.3)
    finally:
        await guarded.close()
    assert guarded.shared_state("demo")["weights"] == {"baseline": 0, "fp8": 10}
    assert "model demo pool fp8: kept weight 10: going back was refused" in caplog.text
