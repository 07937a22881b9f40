"""``FlowController`` on hand-set workers in one event loop: no process, no network."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from prometheus_client import generate_latest

from radix.api_errors import ApiError
from router.config import BandConfig, FlowConfig, TenantLimits
from router.context import Router
from router.decision import Candidates
from router.fleet.probes import WorkerLoad
from router.fleet.worker_state import InFlight
from router.front.auth import Tenant
from router.state.shared_state import InProcessSharedState
from tests.support.aio import TEST_SECRET, eventually
from tests.support.flow_control import ALICE, BOB, flow_call, flow_router, flow_worker, queued_turn
from tests.support.metric_samples import sample
from tests.support.router_configs import make_config

pytestmark = pytest.mark.anyio

async def test_a_request_goes_straight_on_while_its_worker_has_headroom() -> None:
    router = flow_router()
    try:
        worker = flow_worker(router)
        turn = await router.flow.turn(Candidates([worker], [], None), flow_call(router, "hi"),
                                      ALICE, None)
        assert turn.ranking is not None and turn.ranking.ranked == [worker]
        assert worker.num_in_flight_requests == 1  # the reservation
        turn.release()
        turn.release()
        assert worker.num_in_flight_requests == 0
    finally:
        await router.close()


async def test_a_flooding_tenant_does_not_hold_back_another() -> None:
    router = flow_router()
    try:
        worker = flow_worker(router)
        busy = InFlight(worker, 0, 0)
        granted: list[str] = []
        flood = [asyncio.create_task(queued_turn(router, worker, f"alice {i}", ALICE, granted))
                 for i in range(6)]
        await asyncio.sleep(0.01)
        victim = asyncio.create_task(queued_turn(router, worker, "bob 0", BOB, granted))
        await asyncio.sleep(0.01)
        assert granted == []
        busy.end()
        router.flow.wake()
        await asyncio.wait_for(asyncio.gather(victim, *flood), 5)
        assert granted.index("bob 0") <= 1, granted
        assert granted[0] == "alice 0"
    finally:
        await router.close()


async def test_a_request_past_its_bands_ttl_is_shed_with_retry_after() -> None:
    router = flow_router(ttl_s=0.2)
    try:
        worker = flow_worker(router)
        busy = InFlight(worker, 0, 0)
        with pytest.raises(ApiError) as refused:
            await router.flow.turn(Candidates([worker], [], None), flow_call(router, "late"),
                                   ALICE, None)
        assert refused.value.status == 429
        assert refused.value.code == "flow_control_ttl"
        assert int(refused.value.headers["Retry-After"]) >= 1
        metrics = generate_latest(router.metrics.registry).decode()
        assert sample(metrics, "router_flow_shed_total",
                      {"band": "standard", "reason": "ttl"}) == 1
        assert worker.num_in_flight_requests == 1
        busy.end()
    finally:
        await router.close()


async def test_a_client_that_leaves_while_queued_is_dropped_and_holds_nothing() -> None:
    router = flow_router()
    try:
        worker = flow_worker(router)
        busy = InFlight(worker, 0, 0)
        waiting = asyncio.create_task(router.flow.turn(
            Candidates([worker], [], None), flow_call(router, "gone"), ALICE, None))
        await eventually(lambda: sample(generate_latest(router.metrics.registry).decode(),
                                        "router_flow_queued_requests",
                                        {"band": "standard"}) == 1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        metrics = generate_latest(router.metrics.registry).decode()
        assert sample(metrics, "router_flow_queued_requests", {"band": "standard"}) == 0
        assert sample(metrics, "router_flow_cancelled_total", {"band": "standard"}) == 1
        busy.end()
        assert worker.num_in_flight_requests == 0
    finally:
        await router.close()


async def test_within_the_window_the_request_whose_prefix_the_worker_holds_goes_first() -> None:
    router = flow_router(locality_window=2)
    try:
        worker = flow_worker(router)
        cached = "a long shared document that the worker already holds " * 3
        held = flow_call(router, cached, BOB)
        router.index.note_routed("ns", worker.worker_id, held.prompt.key, "bob")
        busy = InFlight(worker, 0, 0)
        granted: list[str] = []
        cold = asyncio.create_task(queued_turn(router, worker, "something cold " * 9, ALICE,
                                           granted))
        await asyncio.sleep(0.01)
        warm = asyncio.create_task(queued_turn(router, worker, cached, BOB, granted))
        await asyncio.sleep(0.01)
        busy.end()
        router.flow.wake()
        await asyncio.wait_for(asyncio.gather(cold, warm), 5)
        assert granted[0] == cached
    finally:
        await router.close()


async def test_locality_never_lets_a_lower_bands_request_pass_a_higher_ones() -> None:
    router = flow_router()
    try:
        worker = flow_worker(router)
        cached = "a long shared document that the worker already holds " * 3
        router.index.note_routed("ns", worker.worker_id, flow_call(router, cached, BOB).prompt.key,
                                 "bob")
        busy = InFlight(worker, 0, 0)
        granted: list[str] = []
        urgent = Tenant("alice", TenantLimits(), band="interactive")
        warm = asyncio.create_task(queued_turn(router, worker, cached, BOB, granted))
        await asyncio.sleep(0.01)
        cold = asyncio.create_task(queued_turn(router, worker, "urgent and cold " * 9, urgent,
                                           granted))
        await asyncio.sleep(0.01)
        busy.end()
        router.flow.wake()
        await asyncio.wait_for(asyncio.gather(cold, warm), 5)
        assert granted[0] == "urgent and cold " * 9
    finally:
        await router.close()


async def test_a_lower_band_leaves_part_of_each_worker_to_the_bands_above() -> None:
    bands = (BandConfig("interactive", 5.0), BandConfig("batch", 5.0, max_slot_fraction=0.5))
    config = replace(make_config(["http://127.0.0.1:9"]),
                     flow=FlowConfig(enabled=True, bands=bands, default_band="batch"))
    router = Router.build(config, TEST_SECRET, InProcessSharedState())
    try:
        worker = flow_worker(router)
        worker.load = WorkerLoad(max_num_requests=8, max_num_running=4)
        candidates = Candidates([worker], [], None)
        turns = [await router.flow.turn(candidates, flow_call(router, f"batch {i}"), ALICE, None)
                 for i in range(2)]
        third = asyncio.create_task(router.flow.turn(candidates, flow_call(router, "batch 2"),
                                                     ALICE, None))
        await asyncio.sleep(0.1)
        assert not third.done()  # half of the four slots is the batch band's share
        urgent = Tenant("bob", TenantLimits(), band="interactive")
        turns.append(await asyncio.wait_for(router.flow.turn(
            candidates, flow_call(router, "urgent", urgent), urgent, None), 1))
        third.cancel()
        for turn in turns:
            turn.release()
    finally:
        await router.close()


async def test_a_band_waits_while_its_worker_has_prefill_pending_past_its_bound() -> None:
    """A batch request's reservation counts its uncached prompt tokens: the next batch
    request waits until that prefill is done (first token), an interactive one does not."""
    bands = (BandConfig("interactive", 5.0),
             BandConfig("batch", 5.0, max_pending_prefill_tokens=1))
    config = replace(make_config(["http://127.0.0.1:9"]),
                     flow=FlowConfig(enabled=True, bands=bands, default_band="batch"))
    router = Router.build(config, TEST_SECRET, InProcessSharedState())
    try:
        worker = flow_worker(router)
        worker.load = WorkerLoad(max_num_requests=8, max_num_running=4)
        candidates = Candidates([worker], [], None)
        first = await router.flow.turn(candidates, flow_call(router, "batch 0"), ALICE, None)
        assert worker.num_in_flight_prompt_tokens > 0
        second = asyncio.create_task(router.flow.turn(candidates, flow_call(router, "batch 1"),
                                                      ALICE, None))
        await asyncio.sleep(0.1)
        assert not second.done()
        urgent = Tenant("bob", TenantLimits(), band="interactive")
        (await asyncio.wait_for(router.flow.turn(
            candidates, flow_call(router, "urgent", urgent), urgent, None), 1)).release()
        in_flight = InFlight(worker, 0, 0)  # the first request's own count takes over
        first.release()
        router.flow.wake()
        (await asyncio.wait_for(second, 1)).release()
        in_flight.end()
    finally:
        await router.close()
