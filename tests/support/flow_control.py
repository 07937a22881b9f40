"""Flow control on hand-set workers in one event loop: a router with flow control on,
ready workers with one batch slot, calls from two tenants."""

from __future__ import annotations

from dataclasses import replace

from radix.openai.requests import COMPLETIONS, parse_openai_request
from router.config import BandConfig, FlowConfig, TenantLimits
from router.context import Router
from router.decision import Candidates
from router.fleet.probes import WorkerLoad
from router.fleet.worker_state import WorkerState
from router.flow.shares import FlowShares
from router.forward.proxy import Call
from router.front.auth import Tenant
from router.state.shared_state import InProcessSharedState
from tests.support.aio import TEST_SECRET
from tests.support.router_configs import make_config

ALICE = Tenant("alice", TenantLimits())
BOB = Tenant("bob", TenantLimits())


def flow_router(ttl_s: float = 5.0, flow_shares: FlowShares | None = None,
                **flow: object) -> Router:
    """A router with flow control on (two bands of ``ttl_s``) and one configured worker."""
    urls = ["http://127.0.0.1:9"]
    bands = (BandConfig("interactive", ttl_s), BandConfig("standard", ttl_s))
    config = replace(make_config(urls), flow=FlowConfig(enabled=True, bands=bands, **flow))
    return Router.build(config, TEST_SECRET, InProcessSharedState(), None, flow_shares)


def flow_worker(router: Router, index: int = 0) -> WorkerState:
    """Worker u<index>, ready, with one batch slot (so one request is its headroom)."""
    worker = WorkerState(router.config.workers[index], f"http://127.0.0.1:{9 + index}", {})
    worker.ready, worker.namespace = True, "ns"
    worker.load = WorkerLoad(max_num_requests=8, max_num_running=1)
    return worker


def flow_call(router: Router, text: str, tenant: Tenant = ALICE) -> Call:
    """A completion of ``text`` from ``tenant`` at its band."""
    model = router.models.get("demo")
    request = parse_openai_request({"model": "demo", "prompt": text, "max_tokens": 4},
                                   COMPLETIONS, model.bounds)
    request = replace(request, priority=router.config.flow.effective_band(tenant.band, 0))
    return Call(request, "demo", model.prompt(request, tenant.tenant_id), tenant.tenant_id,
                4, "salt")


async def queued_turn(router: Router, worker: WorkerState, text: str, tenant: Tenant,
                      granted: list[str]) -> None:
    """Wait for a turn on ``worker``; note ``text`` when granted, then release it."""
    turn = await router.flow.turn(Candidates([worker], [], None),
                                  flow_call(router, text, tenant), tenant, None)
    granted.append(text)
    turn.release()
