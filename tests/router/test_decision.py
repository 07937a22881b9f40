"""``router.decision.Decider`` on hand-set worker states: no process, no network."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import generate_latest

from radix.openai.requests import COMPLETIONS, parse_openai_request
from router.config import PDConfig
from router.context import Router
from router.decision import Attempt, Candidates, Decision, Matches
from router.fleet.probes import WorkerLoad
from router.fleet.worker_state import WorkerState
from router.forward.proxy import Call
from router.state.shared_state import InProcessSharedState
from tests.support.aio import TEST_SECRET
from tests.support.metric_samples import sample
from tests.support.router_configs import make_config

pytestmark = pytest.mark.anyio

PROMPT = "a prompt long enough to be worth prefilling elsewhere " * 4


def _worker(router: Router, index: int, role: str, load: WorkerLoad) -> WorkerState:
    """Worker u<index> of ``router``'s config as ready, with ``role`` and ``load``."""
    worker = WorkerState(router.config.workers[index], f"http://127.0.0.1:{9 + index}", {})
    worker.ready, worker.namespace, worker.role, worker.load = True, "ns", role, load
    return worker


def _call(router: Router) -> Call:
    model = router.models.get("demo")
    request = parse_openai_request({"model": "demo", "prompt": PROMPT, "max_tokens": 4},
                                   COMPLETIONS, model.bounds)
    return Call(request, "demo", model.prompt(request, "alice"), "alice", 4, "salt")


async def _decide_beside(prefill_load: WorkerLoad, prefill_namespace: str = "ns"
                         ) -> tuple[Decision, WorkerState, WorkerState, str]:
    """A PD decision for a decode worker and a prefill worker with ``prefill_load`` in
    ``prefill_namespace`` (the decode worker's: ``ns``): (the decision, decode,
    prefill, the router's metrics after it)."""
    urls = ["http://127.0.0.1:9", "http://127.0.0.1:10"]
    config = replace(make_config(urls), pd=PDConfig(min_uncached_tokens=1))
    router = Router.build(config, TEST_SECRET, InProcessSharedState())
    try:
        decode = _worker(router, 0, "decode", WorkerLoad())
        prefill = _worker(router, 1, "prefill", prefill_load)
        prefill.namespace = prefill_namespace
        decision = await router.decider.decide(Candidates([decode, prefill], [], None),
                                               _call(router))  # no leg is sent: no server
        return decision, decode, prefill, generate_latest(router.metrics.registry).decode()
    finally:
        await router.close()


async def test_saturated_prefill_workers_leave_the_request_whole_on_the_decode_worker():
    decision, decode, _, metrics = await _decide_beside(
        WorkerLoad(num_requests_running=2, max_num_requests=2))
    assert decision.ranked == [decode]
    assert decision.kv_transfer_params is None
    assert [a.worker for a in decision.attempts()] == [decode]
    assert sample(metrics, "router_pd_requests_total", {"mode": "fallback"}) == 1


async def test_a_decode_worker_given_pulled_blocks_is_tried_again_without_them_first():
    router = Router.build(make_config(["http://127.0.0.1:9", "http://127.0.0.1:10"]),
                          TEST_SECRET, InProcessSharedState())
    try:
        first, second = (_worker(router, i, "both", WorkerLoad()) for i in (0, 1))
        params = {"remote_engine_id": "p0"}
        decision = Decision([first, second], Matches({}, {}), params)
        assert decision.attempts() == [Attempt(first, params), Attempt(first, None),
                                       Attempt(second, None)]
    finally:
        await router.close()


async def test_a_prefill_worker_at_its_hold_cap_is_skipped_for_a_whole_request():
    decision, decode, prefill, metrics = await _decide_beside(
        WorkerLoad(num_held_blocks=31, max_held_blocks=31))
    assert decision.kv_transfer_params is None and decision.prefill is None
    assert [a.worker for a in decision.attempts()] == [decode]
    assert prefill.ready  # never tried: a leg to its closed port would mark it failed
    assert sample(metrics, "router_pd_requests_total", {"mode": "fallback"}) == 1


async def test_a_prefill_worker_of_another_namespace_is_never_asked_for_a_leg():
    decision, decode, prefill, metrics = await _decide_beside(WorkerLoad(), "another")
    assert decision.kv_transfer_params is None and decision.prefill is None
    assert [a.worker for a in decision.attempts()] == [decode]
    assert prefill.ready  # never tried: its blocks would be refused by the decode worker
    assert sample(metrics, "router_pd_requests_total", {"mode": "aggregated"}) == 1
