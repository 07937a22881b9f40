"""``FlowController`` on hand-set workers in one event loop: no process, no network."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from prometheus_client import generate_latest

from radix.api_errors import ApiError
from radix.openai.requests import COMPLETIONS, parse_openai_request
from router.config import BandConfig, FlowConfig, TenantLimits
from router.context import Router
from router.decision import Candidates
from router.fleet.probes import WorkerLoad
from router.fleet.worker_state import InFlight, WorkerState
from router.forward.proxy import Call
from router.front.auth import Tenant
from router.state.shared_state import InProcessSharedState
from tests.support.aio import TEST_SECRET, eventually
from tests.support.metric_samples import sample
from tests.support.router_configs import make_config

pytestmark = pytest.mark.anyio

ALICE = Tenant("alice", TenantLimits())
BOB = Tenant("bob", TenantLimits())


def _router(ttl_s: float = 5.0, **flow: object) -> Router:
    urls = ["http://127.0.0.1:9"]
    bands = (BandConfig("interactive", ttl_s), BandConfig("standard", ttl_s))
    config = replace(make_config(urls), flow=FlowConfig(enabled=True, bands=bands, **flow))
    return Router.build(config, TEST_SECRET, InProcessSharedState())


def _worker(router: Router, index: int = 0) -> WorkerState:
    """Worker u<index>, ready, with one batch slot (so one request is its headroom)."""
    worker = WorkerState(router.config.workers[index], f"http://127.0.0.1:{9 + index}", {})
    worker.ready, worker.namespace = True, "ns"
    worker.load = WorkerLoad(max_num_requests=8, max_num_running=1)
    return worker


def _call(router: Router, text: str, tenant: Tenant = ALICE) -> Call:
    model = router.models.get("demo")
    request = parse_openai_request({"model": "demo", "prompt": text, "max_tokens": 4},
                                   COMPLETIONS, model.bounds)
    request = replace(request, priority=router.config.flow.effective_band(tenant.band, 0))
    return Call(request, "demo", model.prompt(request, tenant.tenant_id), tenant.tenant_id,
                4, "salt")


async def _queued(router: Router, worker: WorkerState, text: str, tenant: Tenant,
                  granted: list[str]) -> None:
    """Wait for a turn; note ``text`` when granted and hold the slot briefly."""
    turn = await router.flow.turn(Candidates([worker], [], None), _call(router, text, tenant),
                                  tenant, None)
    granted.append(text)
    turn.release()


async def test_a_request_goes_straight_on_while_its_worker_has_headroom() -> None:
    router = _router()
    try:
        worker = _worker(router)
        turn = await router.flow.turn(Candidates([worker], [], None), _call(router, "hi"),
                                      ALICE, None)
        assert turn.ranking is not None and turn.ranking.ranked == [worker]
        assert worker.num_in_flight_requests == 1  # the reservation
        turn.release()
        turn.release()
        assert worker.num_in_flight_requests == 0
    finally:
        await router.close()


async def test_a_flooding_tenant_does_not_hold_back_another() -> None:
    router = _router()
    try:
        worker = _worker(router)
        busy = InFlight(worker, 0)
        granted: list[str] = []
        flood = [asyncio.create_task(_queued(router, worker, f"alice {i}", ALICE, granted))
                 for i in range(6)]
        await asyncio.sleep(0.01)
        victim = asyncio.create_task(_queued(router, worker, "bob 0", BOB, granted))
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
    router = _router(ttl_s=0.2)
    try:
        worker = _worker(router)
        busy = InFlight(worker, 0)
        with pytest.raises(ApiError) as refused:
            await router.flow.turn(Candidates([worker], [], None), _call(router, "late"),
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
    router = _router()
    try:
        worker = _worker(router)
        busy = InFlight(worker, 0)
        waiting = asyncio.create_task(router.flow.turn(
            Candidates([worker], [], None), _call(router, "gone"), ALICE, None))
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
    router = _router(locality_window=2)
    try:
        worker = _worker(router)
        cached = "a long shared document that the worker already holds " * 3
        held = _call(router, cached, BOB)
        router.index.note_routed("ns", worker.worker_id, held.prompt.key, "bob")
        busy = InFlight(worker, 0)
        granted: list[str] = []
        cold = asyncio.create_task(_queued(router, worker, "something cold " * 9, ALICE,
                                           granted))
        await asyncio.sleep(0.01)
        warm = asyncio.create_task(_queued(router, worker, cached, BOB, granted))
        await asyncio.sleep(0.01)
        busy.end()
        router.flow.wake()
        await asyncio.wait_for(asyncio.gather(cold, warm), 5)
        assert granted[0] == cached
    finally:
        await router.close()


async def test_locality_never_lets_a_lower_bands_request_pass_a_higher_ones() -> None:
    router = _router()
    try:
        worker = _worker(router)
        cached = "a long shared document that the worker already holds " * 3
        router.index.note_routed("ns", worker.worker_id, _call(router, cached, BOB).prompt.key,
                                 "bob")
        busy = InFlight(worker, 0)
        granted: list[str] = []
        urgent = Tenant("alice", TenantLimits(), band="interactive")
        warm = asyncio.create_task(_queued(router, worker, cached, BOB, granted))
        await asyncio.sleep(0.01)
        cold = asyncio.create_task(_queued(router, worker, "urgent and cold " * 9, urgent,
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
        worker = _worker(router)
        worker.load = WorkerLoad(max_num_requests=8, max_num_running=4)
        candidates = Candidates([worker], [], None)
        turns = [await router.flow.turn(candidates, _call(router, f"batch {i}"), ALICE, None)
                 for i in range(2)]
        third = asyncio.create_task(router.flow.turn(candidates, _call(router, "batch 2"),
                                                     ALICE, None))
        await asyncio.sleep(0.1)
        assert not third.done()  # half of the four slots is the batch band's share
        urgent = Tenant("bob", TenantLimits(), band="interactive")
        turns.append(await asyncio.wait_for(router.flow.turn(
            candidates, _call(router, "urgent", urgent), urgent, None), 1))
        third.cancel()
        for turn in turns:
            turn.release()
    finally:
        await router.close()
