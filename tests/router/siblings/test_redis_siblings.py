"""Two in-process routers sharing one real ``redis-server``: a worker added or removed
through either admin API reaches the other, public prefixes are shared, and the
routing decisions for ``openai`` workers land in the other router's index."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
import redis.asyncio as redis
from aiohttp import web

from harness import instant_upstream
from radix.keys import to_key
from tests.support.aio import (
    ADMIN,
    ALICE,
    eventually,
    key_recording_upstream,
    post,
    running_router,
    serving,
)
from tests.support.router_configs import canary_pools, shared_config

pytestmark = [pytest.mark.slow, pytest.mark.anyio]


async def test_worker_changes_and_prefixes_reach_the_other_router(redis_server) -> None:
    config = shared_config(redis_server.url, [])
    async with serving(instant_upstream.create_app("x")) as up, \
            running_router(config, shared=True) as (url_a, a), \
            running_router(config, shared=True) as (url_b, b), \
            aiohttp.ClientSession() as session:
        worker = {"id": "extra", "model": "demo", "url": up}
        status, _ = await post(session, f"{url_a}/admin/workers",
                               {"action": "add", "worker": worker}, ADMIN)
        assert status == 200
        await eventually(lambda: (w := b.registry.get("extra")) is not None and w.ready, 3.0)
        status, _ = await post(session, f"{url_b}/v1/completions",
                               {"model": "demo", "prompt": "hi", "max_tokens": 1}, ALICE)
        assert status == 200 and b.registry.get("extra").stats.num_requests == 1

        prefix = "Shared system prompt for every tenant. " * 2
        status, _ = await post(session, f"{url_b}/admin/public-prefixes",
                               {"model": "demo", "text": prefix}, ADMIN)
        assert status == 200
        tokens = a.models.get("demo").tokenizer.encode(prefix + "and more")
        public = a.models.get("demo").public_prefixes
        await eventually(lambda: public.num_public_tokens(to_key(tokens)) > 0, 3.0)

        status, _ = await post(session, f"{url_b}/admin/workers",
                               {"action": "remove", "id": "extra"}, ADMIN)
        assert status == 200
        await eventually(lambda: a.registry.get("extra") is None, 3.0)


async def test_openai_routing_decisions_reach_the_other_routers_index(redis_server) -> None:
    async with serving(instant_upstream.create_app("x")) as up:
        config = shared_config(redis_server.url,
                               [{"id": "vllm", "model": "demo", "url": up, "kind": "openai"}])
        async with running_router(config, shared=True) as (url_a, a), \
                running_router(config, shared=True) as (_, b), \
                aiohttp.ClientSession() as session:
            prompt = "A long document about routing decisions on several routers. " * 4
            status, _ = await post(session, f"{url_a}/v1/completions",
                                   {"model": "demo", "prompt": prompt, "max_tokens": 1}, ALICE)
            assert status == 200
            key = to_key(b.models.get("demo").tokenizer.encode(prompt))
            namespace = b.registry.get("vllm").namespace
            matched = await eventually(
                lambda: b.index.match(namespace, key, "alice").get("vllm", 0), 3.0)
            assert matched == a.index.match(namespace, key, "alice")["vllm"]
            assert b.index.match(namespace, key, "bob") == {}  # still per tenant


async def test_the_routed_stream_holds_only_what_indexes_keep(redis_server) -> None:
    """Each entry's key is cut to the approximate capacity, and entries older than
    ``approximate_ttl_s`` are trimmed: the stream is bounded in bytes, not only count."""
    async with serving(instant_upstream.create_app("x")) as up:
        config = shared_config(redis_server.url,
                               [{"id": "vllm", "model": "demo", "url": up, "kind": "openai"}],
                               index={"approximate_ttl_s": 1.0,
                                      "approximate_capacity_tokens": 16})
        client = redis.Redis.from_url(redis_server.url)
        stream = "peers-test:routed"
        async with running_router(config, shared=True) as (url, _), \
                aiohttp.ClientSession() as session:
            async def route(prompt: str) -> None:
                status, _ = await post(session, f"{url}/v1/completions",
                                       {"model": "demo", "prompt": prompt, "max_tokens": 1},
                                       ALICE)
                assert status == 200

            try:
                await route("x" * 10_000)
                entries = await eventually(lambda: client.xrange(stream), 3.0)
                assert [len(fields[b"k"]) for _, fields in entries] == [16 * 4]
                await asyncio.sleep(1.2)
                await route("y" * 100)

                async def only_the_new_entry() -> bool:
                    entries = await client.xrange(stream)
                    return len(entries) == 1 and b"y\0\0\0" in entries[0][1][b"k"]
                await eventually(only_the_new_entry, 3.0)
            finally:
                await client.aclose()


async def test_a_routed_stream_entry_is_cut_to_the_entry_cap(redis_server) -> None:
    """Under the default approximate capacity (a million tokens) a long prompt's entry
    still holds only ``stream_entry_max_tokens`` tokens."""
    async with serving(instant_upstream.create_app("x")) as up:
        config = shared_config(redis_server.url,
                               [{"id": "vllm", "model": "demo", "url": up, "kind": "openai"}],
                               redis={"stream_entry_max_tokens": 32})
        client = redis.Redis.from_url(redis_server.url)
        async with running_router(config, shared=True) as (url, _), \
                aiohttp.ClientSession() as session:
            try:
                status, _ = await post(session, f"{url}/v1/completions",
                                       {"model": "demo", "prompt": "z" * 5_000,
                                        "max_tokens": 1}, ALICE)
                assert status == 200
                entries = await eventually(lambda: client.xrange("peers-test:routed"), 3.0)
                assert [len(fields[b"k"]) for _, fields in entries] == [32 * 4]
            finally:
                await client.aclose()


async def test_a_shared_worker_must_pass_the_admin_rules(redis_server, monkeypatch) -> None:
    """Whoever writes to Redis cannot make a router send its secret, or a worker's key
    (under another id, or under that worker's own id at another URL), to a host."""
    monkeypatch.setenv("RADIX_WORKER_KEY_W0", "w0-key")
    seen: list[str] = []
    async with serving(instant_upstream.create_app("x")) as up, \
            serving(key_recording_upstream(seen)) as elsewhere:
        config = shared_config(redis_server.url, [{"id": "w0", "model": "demo", "url": up,
                                                   "api_key_env": "RADIX_WORKER_KEY_W0"}])
        async with running_router(config, shared=True) as (_, router):
            client = redis.Redis.from_url(redis_server.url)

            def entry(worker_id: str, api_key_env: str) -> str:
                return json.dumps({"id": worker_id, "model": "demo", "url": elsewhere,
                                   "api_key_env": api_key_env})
            try:
                await client.hset("peers-test:workers", mapping={
                    "evil": entry("evil", "RADIX_ROUTER_SECRET"),
                    "thief": entry("thief", "RADIX_WORKER_KEY_W0"),
                    "w0": entry("w0", "RADIX_WORKER_KEY_W0"),
                    "fine": json.dumps({"id": "fine", "model": "demo", "url": up})})
                await client.incr("peers-test:workers:version")
                await eventually(lambda: router.registry.get("fine") is not None, 3.0)
                await asyncio.sleep(0.3)  # three poll intervals
                assert router.registry.get("evil") is None
                assert router.registry.get("thief") is None
                assert router.registry.get("w0").url == up
            finally:
                await client.aclose()
    assert "Bearer w0-key" not in seen


def diverging_upstream() -> web.Application:
    """The instant upstream whose ``/generate`` answers other tokens than the
    baseline's: a pool whose KV format changed the greedy output."""
    async def generate(request: web.Request) -> web.Response:
        num_tokens = (await request.json())["sampling"]["max_tokens"]
        return web.json_response({"request_id": "d", "choices": [{
            "index": 0, "token_ids": [7] * num_tokens, "text": "", "finish_reason": "length"}]})

    app = web.Application()
    app.add_routes([*instant_upstream.status_routes(), web.post("/generate", generate)])
    return app


async def test_canary_weights_and_trips_reach_every_router_and_outlive_a_restart(
        redis_server) -> None:
    async with serving(instant_upstream.create_app("base")) as base, \
            serving(diverging_upstream()) as fp8:
        workers = [{"id": "base", "model": "demo", "url": base},
                   {"id": "fp8", "model": "demo", "url": fp8}]
        quiet = shared_config(redis_server.url, workers, canary_pools(3600))
        async with running_router(quiet, shared=True) as (url_a, a), \
                running_router(quiet, shared=True) as (_, b), \
                aiohttp.ClientSession() as session:
            status, _ = await post(session, f"{url_a}/admin/canary",
                                   {"model": "demo", "weights": {"fp8": 3}}, ADMIN)
            assert status == 200
            await eventually(lambda: b.canary.to_dict()["demo"]["pools"]["fp8"]["weight"] == 3,
                             3.0)
            # A third router probes at once: fp8 diverges, it drains fp8, and so do a and b.
            probing = shared_config(redis_server.url, workers, canary_pools(0.2))
            async with running_router(probing, shared=True) as (_, c):
                for router in (c, a, b):
                    fp8_pool = await eventually(
                        lambda r=router: (p := r.canary.to_dict()["demo"]["pools"]["fp8"])[
                            "tripped"] and p, 5.0)
                    assert fp8_pool["weight"] == 0 and fp8_pool["tripped"]["reason"] == "probe"
        # A router started after it all (its config says fp8 1) keeps fp8 drained.
        async with running_router(quiet, shared=True) as (_, d):
            fp8_pool = d.canary.to_dict()["demo"]["pools"]["fp8"]
            assert fp8_pool["weight"] == 0 and fp8_pool["tripped"]["reason"] == "probe"
