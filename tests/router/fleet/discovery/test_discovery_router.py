"""A real router with ``[discovery]`` follows the test API server: pods become
workers (probed and routed like configured ones), leave without ghosts, drain, are
replaced, survive the API server's absence and its refusals, and come from an
InferencePool. Upstreams are instant stand-ins served in this process on loopback
addresses (127.0.0.x stands in for pod IPs)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import redis.asyncio as redis
from aiohttp import web

from harness import instant_upstream
from router.config_toml import parse_config
from router.context import Router
from router.server.app import bind_socket
from tests.support.aio import ADMIN, ALICE, call, eventually, running_router
from tests.support.kube_api import KubeApiServer
from tests.support.router_configs import auth_section, model_table

pytestmark = pytest.mark.anyio
LABELS = {"app": "worker"}
COMPLETION = {"model": "demo", "prompt": "hello there", "max_tokens": 2}


@contextlib.asynccontextmanager
async def upstream(host: str = "127.0.0.1", port: int = 0, delay_s: float = 0.0,
                   seen: list[tuple[str, str | None]] | None = None,
                   weights_digest: str = "none") -> AsyncIterator[int]:
    """An instant radix upstream on ``host:port`` (0: a free port), its ``/generate``
    answering after ``delay_s``, recording each request's (path, Authorization header)
    in ``seen`` when given, reporting ``weights_digest`` (without ``delay_s``); yields
    the port."""
    app = instant_upstream.create_app(weights_digest=weights_digest)
    if delay_s:
        slow = web.Application()

        async def generate(request: web.Request) -> web.StreamResponse:
            await asyncio.sleep(delay_s)
            return await instant_upstream.generate(request)

        slow.add_routes([*instant_upstream.status_routes(), web.post("/generate", generate),
                         web.get("/v1/models", instant_upstream.models)])
        app = slow
    if seen is not None:
        @web.middleware
        async def record(request: web.Request, handler):
            seen.append((request.path, request.headers.get("Authorization")))
            return await handler(request)

        app.middlewares.append(record)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    sock = bind_socket(host, port)
    await web.SockSite(runner, sock).start()
    try:
        yield sock.getsockname()[1]
    finally:
        await runner.cleanup()


def discovery_config(server: KubeApiServer, tmp_path, model: dict[str, Any] | None = None,
                     **discovery: Any):
    """A router on model demo (with ``model``'s extra fields) discovering pods app=worker
    on their port named http."""
    return parse_config({
        "models": {"demo": model_table(**(model or {}))},
        "registry": {"poll_interval_s": 0.1, "probe_timeout_s": 1.0},
        "auth": auth_section({"alice": {}}),
        "discovery": {"kind": "kubernetes", "selector": LABELS, "port_name": "http",
                      "kubeconfig": server.kubeconfig(str(tmp_path / "kubeconfig")),
                      "retry_initial_s": 0.05, "retry_max_s": 0.5, "resync_s": 30.0,
                      "drain_timeout_s": 10.0, **discovery},
        "workers": [],
    })


@contextlib.asynccontextmanager
async def api_server() -> AsyncIterator[KubeApiServer]:
    """The test API server, stopped at the end."""
    server = KubeApiServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def routed(router: Router) -> dict[str, str]:
    """Worker id -> URL of the workers the router routes to now."""
    return {w.worker_id: w.url for w in router.registry.routable("demo")}


def registered(router: Router) -> dict[str, str]:
    """Worker id -> URL of every registered worker (draining ones included)."""
    return {w.worker_id: w.url for w in router.registry.workers()}


async def complete(url: str) -> int:
    """One completion through the router; its status."""
    async with aiohttp.ClientSession() as session:
        status, _, _ = await call(session, "POST", f"{url}/v1/completions", COMPLETION, ALICE)
        return status


async def test_pods_become_workers_and_leave_without_ghosts(tmp_path):
    async with api_server() as server, upstream() as p0, upstream() as p1, upstream() as p2:
        server.add_pod("w0", "127.0.0.1", p0, LABELS)
        server.add_pod("w1", "127.0.0.1", p1, LABELS)
        server.add_pod("other", "127.0.0.1", p2, {"app": "something-else"})
        server.add_pod("pending", "127.0.0.1", p2, LABELS, ready=False)
        async with running_router(discovery_config(server, tmp_path)) as (url, router):
            await eventually(lambda: set(routed(router)) == {"w0", "w1"},
                             describe=lambda: registered(router))
            assert all(w.discovered for w in router.registry.workers())
            assert await complete(url) == 200
            server.evict("w1")
            await eventually(lambda: set(registered(router)) == {"w0"})
            server.set_ready("pending", True)
            await eventually(lambda: set(routed(router)) == {"w0", "pending"})
            server.delete("pending")
            await eventually(lambda: set(registered(router)) == {"w0"})
            async with aiohttp.ClientSession() as session:
                status, body, _ = await call(session, "GET", f"{url}/admin/discovery",
                                             headers=ADMIN)
                _, workers, _ = await call(session, "GET", f"{url}/admin/workers",
                                           headers=ADMIN)
            assert status == 200 and body["up"] and body["num_pods"] == 1
            assert workers["workers"][0]["discovered"] is True


async def test_a_pod_flapping_ready_ends_as_it_last_was(tmp_path):
    async with api_server() as server, upstream() as p0, upstream() as p1:
        server.add_pod("w0", "127.0.0.1", p0, LABELS)
        server.add_pod("w1", "127.0.0.1", p1, LABELS)
        async with running_router(discovery_config(server, tmp_path)) as (url, router):
            await eventually(lambda: len(routed(router)) == 2)
            for i in range(6):
                server.set_ready("w1", i % 2 == 1)
                assert await complete(url) == 200
                await asyncio.sleep(0.05)
            await eventually(lambda: set(routed(router)) == {"w0", "w1"})
            server.set_ready("w1", False)
            await eventually(lambda: set(registered(router)) == {"w0"})
            assert await complete(url) == 200


async def test_a_pod_replaced_under_its_name_moves_the_worker(tmp_path):
    async with api_server() as server, upstream() as p0, upstream() as p1, \
            upstream("127.0.0.2") as p2:
        server.add_pod("w0", "127.0.0.1", p0, LABELS)
        async with running_router(discovery_config(server, tmp_path)) as (url, router):
            await eventually(lambda: routed(router) == {"w0": f"http://127.0.0.1:{p0}"})
            seen: list[dict[str, str]] = []

            async def watch_registry() -> None:
                while True:
                    seen.append(registered(router))
                    await asyncio.sleep(0.005)

            recorder = asyncio.create_task(watch_registry())
            server.delete("w0")
            server.add_pod("w0", "127.0.0.1", p1, LABELS)  # a new UID, another address
            await eventually(lambda: routed(router) == {"w0": f"http://127.0.0.1:{p1}"})
            server.set_ip("w0", "127.0.0.2")
            server.pod("w0")["spec"]["containers"][0]["ports"][0]["containerPort"] = p2
            server.set_ready("w0", True)  # the port change reaches watchers with this event
            await eventually(lambda: routed(router) == {"w0": f"http://127.0.0.2:{p2}"})
            recorder.cancel()
            assert all(len(state) <= 1 for state in seen)
            assert await complete(url) == 200


async def test_a_pod_being_deleted_is_drained_not_cut(tmp_path):
    async with api_server() as server, upstream() as p0, upstream(delay_s=1.5) as slow:
        server.add_pod("w0", "127.0.0.1", p0, LABELS)
        server.add_pod("slow", "127.0.0.1", slow, LABELS)
        config = discovery_config(server, tmp_path)
        async with running_router(config) as (url, router):
            await eventually(lambda: len(routed(router)) == 2)
            worker = router.registry.get("slow")
            requests = [asyncio.create_task(complete(url)) for _ in range(4)]
            await eventually(lambda: worker.num_in_flight_requests > 0)
            server.start_deleting("slow")
            await eventually(lambda: worker.draining)
            assert set(routed(router)) == {"w0"} and "slow" in registered(router)
            assert await complete(url) == 200  # new requests go elsewhere
            assert await asyncio.gather(*requests) == [200] * 4
            await eventually(lambda: "slow" not in registered(router))
            server.delete("slow")


@pytest.mark.slow
async def test_the_api_server_gone_for_a_minute_changes_nothing_then_resyncs(tmp_path):
    async with api_server() as server, upstream() as p0, upstream() as p1:
        server.add_pod("w0", "127.0.0.1", p0, LABELS)
        server.add_pod("w1", "127.0.0.1", p1, LABELS)
        config = discovery_config(server, tmp_path, retry_max_s=5.0)
        async with running_router(config) as (url, router):
            await eventually(lambda: len(routed(router)) == 2)
            await server.stop()
            server.delete("w1")  # while nobody can see it
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            statuses = []
            while loop.time() < deadline:
                statuses.append(await complete(url))
                assert set(routed(router)) == {"w0", "w1"}
                await asyncio.sleep(2)
            assert statuses == [200] * len(statuses)
            assert not router.discovery.status.up
            assert router.discovery.status.num_errors["unreachable"] >= 3
            await server.start()
            await eventually(lambda: set(registered(router)) == {"w0"}, timeout_s=15)
            assert router.discovery.status.up


async def test_rbac_refusal_is_a_clear_error_and_no_crash_loop(tmp_path):
    async with api_server() as server, upstream() as p0:
        server.add_pod("w0", "127.0.0.1", p0, LABELS)
        server.forbidden = True
        config = discovery_config(server, tmp_path, retry_max_s=0.4)
        async with running_router(config) as (url, router), aiohttp.ClientSession() as s:
            await eventually(lambda: router.discovery.status.num_errors["forbidden"] >= 3)
            status, body, _ = await call(s, "GET", f"{url}/admin/discovery", headers=ADMIN)
            assert status == 200 and body["up"] is False
            assert "forbidden" in body["last_error"] and "list and watch" in body["last_error"]
            status, _, _ = await call(s, "GET", f"{url}/health")
            assert status in (200, 503)  # the router serves; it has no worker yet
            server.forbidden = False
            await eventually(lambda: set(routed(router)) == {"w0"})
            assert await complete(url) == 200


async def test_roles_models_and_keys_of_discovered_pods(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIX_WORKER_KEY_KEYED", "k-keyed")
    async with api_server() as server, upstream() as p0, upstream() as p1, \
            upstream() as p2, upstream() as p3:
        server.add_pod("plain", "127.0.0.1", p0, LABELS)  # model from /v1/models
        server.add_pod("labelled", "127.0.0.1", p1, {**LABELS, "radix-router/model": "demo"})
        server.add_pod("prefill", "127.0.0.1", p2, {**LABELS, "radix-router/role": "prefill"})
        server.add_pod("keyed", "127.0.0.1", p3, LABELS)
        server.add_pod("unknown", "127.0.0.1", p3, {**LABELS, "radix-router/model": "nope"})
        config = discovery_config(server, tmp_path, roles=["both", "prefill", "decode"])
        async with running_router(config) as (url, router):
            await eventually(lambda: set(routed(router)) == {"plain", "labelled", "keyed",
                                                              "prefill"})
            assert router.registry.get("prefill").role == "prefill"
            assert router.registry.get("plain").role == "both"
            assert router.registry.get("keyed").config.api_key_env == "RADIX_WORKER_KEY_KEYED"
            assert router.registry.get("keyed").headers == {"Authorization": "Bearer k-keyed"}
            assert router.registry.get("plain").config.api_key_env is None
            await eventually(lambda: router.discovery.status.num_skipped == 1)  # unknown model


async def test_an_inference_pool_selects_the_pods_and_ports(tmp_path):
    async with api_server() as server, upstream("127.0.0.2") as port, \
            upstream("127.0.0.3", port), upstream("127.0.0.4", port):
        server.add_pod("a", "127.0.0.2", 1, {"pool": "a"})
        server.add_pod("b", "127.0.0.3", 1, {"pool": "b"})
        server.add_pod("c", "127.0.0.4", 1, {"pool": "b"})
        config = discovery_config(server, tmp_path, kind="inferencepool", pool="demo-pool",
                                  selector={}, port_name=None)
        async with running_router(config) as (url, router):
            await asyncio.sleep(0.3)
            assert registered(router) == {}  # no pool yet
            server.put_pool("demo-pool", {"pool": "a"}, [port])
            await eventually(lambda: routed(router) == {"a": f"http://127.0.0.2:{port}"})
            assert await complete(url) == 200
            server.put_pool("demo-pool", {"pool": "b"}, [port])
            await eventually(lambda: set(routed(router)) == {"b", "c"})
            assert "a" not in registered(router)
            server.delete("demo-pool", kind="inferencepools")
            await eventually(lambda: registered(router) == {})


@pytest.mark.slow
async def test_routers_sharing_redis_discover_each_for_itself_and_converge(tmp_path,
                                                                           redis_server):
    async with api_server() as server, upstream() as p0, upstream() as p1, upstream() as p2:
        server.add_pod("w0", "127.0.0.1", p0, LABELS)
        server.add_pod("w1", "127.0.0.1", p1, LABELS)
        config = parse_config({
            "models": {"demo": model_table()},
            "registry": {"poll_interval_s": 0.1},
            "auth": auth_section({"alice": {}}),
            "workers": [{"id": "fixed", "model": "demo", "url": f"http://127.0.0.1:{p2}"}],
            "redis": {"url": redis_server.url, "key_prefix": "discovery-test",
                      "heartbeat_interval_s": 0.1, "lease_ttl_s": 2.0, "sync_interval_s": 0.1},
            "discovery": {"kind": "kubernetes", "selector": LABELS, "port_name": "http",
                          "kubeconfig": server.kubeconfig(str(tmp_path / "kubeconfig")),
                          "retry_initial_s": 0.05},
        })
        async with asyncio.timeout(90), running_router(config, shared=True) as (_, one), \
                running_router(config, shared=True) as (_, two):
            for router in (one, two):
                await eventually(lambda r=router: set(routed(r)) == {"fixed", "w0", "w1"})
            shared = redis.Redis.from_url(redis_server.url, socket_timeout=5,
                                          socket_connect_timeout=5)
            assert set(await shared.hkeys("discovery-test:workers")) == {b"fixed"}
            server.delete("w1")
            server.add_pod("w2", "127.0.0.1", p1, LABELS)
            for router in (one, two):
                await eventually(lambda r=router: set(routed(r)) == {"fixed", "w0", "w2"})
            await asyncio.sleep(0.5)  # several shared-registry syncs: nothing changes
            assert set(routed(one)) == set(routed(two)) == {"fixed", "w0", "w2"}
            await shared.aclose()


async def test_a_discovered_pod_with_other_weights_is_probed_but_never_routed(tmp_path):
    weights, other = "a" * 64, "b" * 64
    async with api_server() as server, upstream(weights_digest=weights) as p0, \
            upstream(weights_digest=other) as p1:
        server.add_pod("w0", "127.0.0.1", p0, LABELS)
        server.add_pod("stranger", "127.0.0.1", p1, LABELS)
        config = discovery_config(server, tmp_path, {"expect": {"weights_digest": weights}})
        async with running_router(config) as (url, router):
            await eventually(lambda: set(routed(router)) == {"w0"})
            stranger = await eventually(lambda: router.registry.get("stranger"))
            await eventually(lambda: stranger.expectation_mismatches)
            assert stranger.discovered and not stranger.ready
            assert stranger.reason == ("does not meet models.demo.expect: weights_digest: "
                                       f"expected {weights!r}, reported {other!r}")
            for _ in range(4):
                assert await complete(url) == 200
            assert set(routed(router)) == {"w0"} and stranger.stats.num_requests == 0
