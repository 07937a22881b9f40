"""A prefill leg's ``kv_transfer_params`` may name only the transfer endpoint its
worker reported under its key (``/info``'s ``kv_transfer``, read by the probe): params
naming any other address are a failed leg, the request served whole on the decode
worker and counted as a fallback (docs/pd.md). ``router.decision.Decider`` on
hand-set worker states, with the prefill leg's answer stubbed: no process, no network."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import generate_latest

from radix.openai.requests import COMPLETIONS, parse_openai_request
from router.config import PDConfig
from router.context import Router
from router.decision import Candidates
from router.fleet.probes import WorkerLoad, transfer_endpoint
from router.fleet.worker_state import WorkerState
from router.forward.proxy import Call
from router.state.shared_state import InProcessSharedState
from tests.support.aio import TEST_SECRET
from tests.support.metric_samples import sample
from tests.support.router_configs import make_config

pytestmark = pytest.mark.anyio

PROMPT = "a prompt long enough to be worth prefilling elsewhere " * 4
REPORTED = ("127.0.0.1", 40417)


def _worker(router: Router, index: int, role: str) -> WorkerState:
    worker = WorkerState(router.config.workers[index], f"http://127.0.0.1:{9 + index}", {})
    worker.ready, worker.namespace, worker.role, worker.load = True, "ns", role, WorkerLoad()
    return worker


async def _decide(answer_host: str, answer_port: int, reported: tuple[str, int] | None
                  ) -> tuple[dict | None, str, list[tuple[str, dict]]]:
    """The decode leg's params when the prefill worker reported ``reported`` and its
    leg answered params naming ``answer_host:answer_port``; the router's metrics; and
    the holds released, as (worker id, params)."""
    urls = ["http://127.0.0.1:9", "http://127.0.0.1:10"]
    config = replace(make_config(urls), pd=PDConfig(min_uncached_tokens=1))
    router = Router.build(config, TEST_SECRET, InProcessSharedState())
    try:
        decode, prefill = _worker(router, 0, "decode"), _worker(router, 1, "prefill")
        prefill.transfer_endpoint = reported

        async def prefill_leg(call: Call, worker: WorkerState) -> dict:
            assert worker is prefill
            return {"do_remote_prefill": True, "remote_host": answer_host,
                    "remote_port": answer_port, "remote_request_id": "t"}

        released: list[tuple[str, dict]] = []
        router.decider._proxy.prefill = prefill_leg  # type: ignore[method-assign]
        router.decider._proxy.release_hold = (  # type: ignore[method-assign]
            lambda worker, params: released.append((worker.worker_id, params)))
        model = router.models.get("demo")
        request = parse_openai_request({"model": "demo", "prompt": PROMPT, "max_tokens": 4},
                                       COMPLETIONS, model.bounds)
        call = Call(request, "demo", model.prompt(request, "alice"), "alice", 4, "salt")
        decision = await router.decider.decide(Candidates([decode, prefill], [], None), call)
        assert decision.ranked == [decode]
        return (decision.kv_transfer_params, generate_latest(router.metrics.registry).decode(),
                released)
    finally:
        await router.close()


async def test_params_naming_the_reported_endpoint_go_to_the_decode_worker():
    params, metrics, released = await _decide(*REPORTED, REPORTED)
    assert params is not None and params["remote_port"] == REPORTED[1]
    assert released == []
    assert sample(metrics, "router_pd_requests_total", {"mode": "disaggregated"}) == 1


@pytest.mark.parametrize(("host", "port", "reported"), [
    ("127.0.0.1", 6379, REPORTED),  # another port on the same host (say, Redis)
    ("10.0.0.7", REPORTED[1], REPORTED),  # another host
    (*REPORTED, None),  # the worker reports no transfer endpoint at all
])
async def test_params_naming_another_endpoint_are_a_failed_leg(host, port, reported):
    params, metrics, released = await _decide(host, port, reported)
    assert params is None  # served whole on the decode worker
    assert [worker_id for worker_id, _ in released] == ["u1"]  # its hold ends at once
    assert sample(metrics, "router_pd_requests_total", {"mode": "fallback"}) == 1
    assert sample(metrics, "router_pd_requests_total", {"mode": "disaggregated"}) == 0


def test_the_probe_reads_a_transfer_endpoint_or_none():
    assert transfer_endpoint({"engine_id": "w", "host": "127.0.0.1", "port": 40417}) == REPORTED
    for bad in (None, [], {"host": "h"}, {"host": "", "port": 1}, {"host": "h", "port": 0},
                {"host": "h", "port": True}, {"host": "h", "port": "80"},
                {"host": "h", "port": 70000}):
        assert transfer_endpoint(bad) is None, bad
