"""Backpressure: a worker whose queue is at its bound gets nothing more; when every
worker is there, the router refuses at once (503 ``saturated``, Retry-After) instead
of queueing."""

from __future__ import annotations

import json

import aiohttp
import pytest
from aiohttp import web

from harness import instant_upstream
from radix.keys import to_key
from router.routing.load_cost import is_saturated
from router.routing.views import WorkerView
from tests.support.aio import ALICE, running_router, serving
from tests.support.router_configs import make_config

pytestmark = pytest.mark.anyio


def test_saturated_means_running_plus_queued_or_in_flight_at_the_bound() -> None:
    assert not is_saturated(WorkerView("w", num_requests_running=9))
    assert is_saturated(WorkerView("w", num_requests_running=3, num_requests_waiting=1,
                                   max_num_requests=4))
    assert is_saturated(WorkerView("w", num_in_flight_requests=4, max_num_requests=4))
    assert not is_saturated(WorkerView("w", num_requests_running=3, max_num_requests=4))


def loaded_upstream(num_active: int, bound: int, seen: list[str]) -> web.Application:
    """The instant upstream reporting ``num_active`` running requests and an admission
    bound of ``bound`` in ``/info``; ``/generate`` calls are noted in ``seen``."""
    routes = {r.path: r for r in instant_upstream.status_routes()}

    async def info(request: web.Request) -> web.Response:
        body = json.loads((await routes["/info"].handler(request)).text)
        body["load"]["num_requests_running"] = num_active
        body["engine"] = {"max_num_seqs": bound - 1, "max_waiting_requests": 1}
        return web.json_response(body)

    async def generate(request: web.Request) -> web.StreamResponse:
        seen.append(request.host)
        return await instant_upstream.generate(request)

    app = web.Application()
    app.add_routes([r for path, r in routes.items() if path != "/info"])
    app.add_routes([web.get("/info", info), web.post("/generate", generate)])
    return app


async def test_saturated_workers_are_skipped() -> None:
    seen: list[str] = []
    async with serving(loaded_upstream(4, 4, seen)) as full, \
            serving(loaded_upstream(1, 4, seen)) as free, \
            running_router(make_config([full, free])) as (url, _), \
            aiohttp.ClientSession() as session:
        body = {"model": "demo", "prompt": "hi", "max_tokens": 2}
        for _ in range(3):
            async with session.post(f"{url}/v1/completions", json=body, headers=ALICE) as r:
                assert r.status == 200
        assert seen == [free.removeprefix("http://")] * 3


async def test_every_worker_saturated_is_503_at_once() -> None:
    seen: list[str] = []
    async with serving(loaded_upstream(4, 4, seen)) as first, \
            serving(loaded_upstream(5, 4, seen)) as second, \
            running_router(make_config([first, second])) as (url, _), \
            aiohttp.ClientSession() as session:
        body = {"model": "demo", "prompt": "hi", "max_tokens": 2, "stream": True}
        async with session.post(f"{url}/v1/completions", json=body, headers=ALICE) as r:
            assert r.status == 503 and r.headers["Retry-After"] == "1"
            assert (await r.json())["error"]["code"] == "saturated"
        assert not seen


async def test_a_saturated_canary_pool_falls_back_to_the_baseline_worker_holding_the_prefix(
        ) -> None:
    seen: list[str] = []
    async with serving(loaded_upstream(0, 4, seen)) as first, \
            serving(loaded_upstream(0, 4, seen)) as second, \
            serving(loaded_upstream(4, 4, seen)) as full:
        pools = {"pools": {"baseline": {"workers": ["u0", "u1"], "weight": 0},
                           "canary": {"workers": ["u2"], "weight": 1}},
                 "canary": {"probe_interval_s": 3600}}
        config = make_config([first, second, full], policy="cache_aware", model=pools)
        async with running_router(config) as (url, router), \
                aiohttp.ClientSession() as session:
            token_ids = list(range(100, 164))
            namespace = router.registry.workers()[0].namespace
            for holder, holder_url in (("u0", first), ("u1", second)):
                for worker_id in ("u0", "u1"):
                    router.index.reset_worker(worker_id)
                router.index.note_routed(namespace, holder, to_key(token_ids), "alice")
                seen.clear()
                body = {"model": "demo", "prompt": token_ids, "max_tokens": 2}
                async with session.post(f"{url}/v1/completions", json=body,
                                        headers=ALICE) as r:
                    assert r.status == 200
                assert seen == [holder_url.removeprefix("http://")]
