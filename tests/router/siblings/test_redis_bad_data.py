"""Whatever is written to the shared Redis, a router keeps following it: a malformed
routed-stream entry or worker entry is skipped, the entries after it still apply, and
the link comes up (real ``redis-server``)."""

from __future__ import annotations

import aiohttp
import pytest
import redis.asyncio as redis

from harness import instant_upstream
from radix.keys import to_key
from tests.support.aio import ADMIN, ALICE, eventually, post, running_router, serving
from tests.support.router_configs import canary_pools, shared_config

pytestmark = [pytest.mark.slow, pytest.mark.anyio]
DEEP = b"[" * 100_000 + b"]" * 100_000


async def test_a_key_that_is_not_whole_tokens_does_not_stop_the_follower(redis_server) -> None:
    async with serving(instant_upstream.create_app("x")) as up:
        config = shared_config(redis_server.url,
                               [{"id": "vllm", "model": "demo", "url": up, "kind": "openai"}])
        client = redis.Redis.from_url(redis_server.url)
        async with running_router(config, shared=True) as (url, router), \
                aiohttp.ClientSession() as session:
            try:
                namespace = router.registry.get("vllm").namespace
                tokens = router.models.get("demo").tokenizer.encode("routed elsewhere " * 8)
                entry = {"r": "other", "n": namespace, "w": "vllm", "s": "alice"}
                for key in (b"\x01\x02\x03\x04\x05", b"x", to_key(tokens)):
                    await client.xadd("peers-test:routed", {**entry, "k": key})
                await client.xadd("peers-test:routed", {"r": "other", "k": b"\xff" * 3})
                await eventually(lambda: router.index.match(namespace, to_key(tokens),
                                                            "alice").get("vllm"), 3.0)
                status, _ = await post(session, f"{url}/v1/completions",
                                       {"model": "demo", "prompt": "hi", "max_tokens": 1}, ALICE)
                assert status == 200
            finally:
                await client.aclose()


async def test_deeply_nested_json_in_the_worker_hash_does_not_wedge_the_link(redis_server
                                                                             ) -> None:
    client = redis.Redis.from_url(redis_server.url)
    try:
        await client.hset("peers-test:workers", mapping={"deep": DEEP, "list": b"[1, 2]",
                                                         "bytes": b"\xff\xfe"})
        await client.incr("peers-test:workers:version")
        async with serving(instant_upstream.create_app("x")) as up:
            config = shared_config(redis_server.url, [])
            async with running_router(config, shared=True) as (_, router):
                assert router.siblings.up  # the resync at start read every entry
                await client.hset("peers-test:workers", mapping={
                    "deep": DEEP + b" ", "fine": f'{{"id": "fine", "model": "demo", '
                                                 f'"url": "{up}"}}'})
                await client.incr("peers-test:workers:version")
                await eventually(lambda: router.registry.get("fine") is not None, 3.0)
                assert [w.worker_id for w in router.registry.workers()] == ["fine"]
                assert router.siblings.up
    finally:
        await client.aclose()


async def test_a_canary_weight_too_large_for_a_float_is_refused_and_counted(redis_server
                                                                           ) -> None:
    client = redis.Redis.from_url(redis_server.url)
    huge = b'{"weights": {"fp8": 1' + b"0" * 400 + b'}, "trips": {}}'
    try:
        await client.hset("peers-test:canary", mapping={"demo": huge})
        await client.incr("peers-test:canary:version")
        async with serving(instant_upstream.create_app("base")) as base, \
                serving(instant_upstream.create_app("fp8")) as fp8:
            workers = [{"id": "base", "model": "demo", "url": base},
                       {"id": "fp8", "model": "demo", "url": fp8}]
            config = shared_config(redis_server.url, workers, canary_pools(3600))
            async with running_router(config, shared=True) as (url, router), \
                    aiohttp.ClientSession() as session:
                assert router.siblings.up  # the resync at start skipped the entry
                assert router.siblings.num_refused_entries == 1
                assert router.canary.to_dict()["demo"]["pools"]["fp8"]["weight"] == 1
                status, _ = await post(session, f"{url}/admin/canary",
                                       {"model": "demo", "weights": {"fp8": 10**400}}, ADMIN)
                assert status == 400
                assert router.canary.to_dict()["demo"]["pools"]["fp8"]["weight"] == 1
    finally:
        await client.aclose()
