"""KVEventFollower against a real demo worker process.

The follower builds an index from the worker's live ``/kv/events`` (in the binary
form it asks for) while requests run through ``POST /generate``; a fresh snapshot then
describes the worker's cache exactly. With and without evictions the live index may
only lag by the partial block a split left unannounced:
floor(snapshot / B) * B <= live <= snapshot (compared while the follower runs: a
worker no longer followed is stale, its entries not matched).
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from radix.events import decode_event
from radix.keys import to_key
from radix.tree import PUBLIC
from router.config import KVEventsConfig, WorkerSpec
from router.fleet.events.follower import KVEventFollower
from router.fleet.events.metrics import KVEventMetrics
from router.fleet.worker_state import WorkerState
from router.routing.index import RouterIndex
from tests.support.aio import eventually

pytestmark = pytest.mark.slow
SCOPES = ("tenant-a", "tenant-b", PUBLIC)
DOC = list(range(1, 49))


async def snapshot_index(session: aiohttp.ClientSession, url: str) -> tuple[RouterIndex, int]:
    """An index built from a fresh snapshot, and the snapshot's head seq."""
    index = RouterIndex()
    head = None
    async with session.get(f"{url}/kv/events") as resp:
        while True:
            try:
                line = await asyncio.wait_for(resp.content.readline(), 0.5)
            except TimeoutError:
                break
            if line.strip():
                event = decode_event(line)
                head = event.seq if head is None else head
                index.apply_event("w", event)
    assert head is not None
    return index, head


async def generate(session: aiohttp.ClientSession, url: str, tokens: list[int], scope: str,
                   num_public_tokens: int = 0) -> list[int]:
    body = {"token_ids": tokens, "scope": scope, "num_public_tokens": num_public_tokens,
            "sampling": {"max_tokens": 3, "temperature": 0, "ignore_eos": True}}
    async with session.post(f"{url}/generate", json=body) as resp:
        assert resp.status == 200, await resp.text()
        return (await resp.json())["choices"][0]["token_ids"]


async def follow_and_compare(url: str, prompts: list[tuple[list[int], str, int]]) -> None:
    live = RouterIndex()
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{url}/ready") as resp:
            namespace = (await resp.json())["namespace_digest"]
        worker = WorkerState(WorkerSpec(worker_id="w", model="demo", url=url), url, {})
        follower = KVEventFollower(live, worker, session, KVEventMetrics(CollectorRegistry()),
                                   config=KVEventsConfig(initial_backoff_s=0.01))
        task = asyncio.create_task(follower.run())
        try:
            queries = []
            for tokens, scope, num_public in prompts:
                output = await generate(session, url, tokens, scope, num_public)
                queries += [tokens, tokens + output, tokens[: len(tokens) // 2 + 3]]
            snapshot, head = await snapshot_index(session, url)
            await eventually(lambda: (follower.status().last_seq or -1) >= head
                             and not follower.health.is_stale, 10,
                             interval_s=0.02, describe=follower.status)
            live.check_invariants()
            assert follower.status().num_resyncs == 0
            for tokens in queries:
                key = to_key(tokens + [7])
                for scope in SCOPES:
                    got = live.match(namespace, key, scope).get("w", 0)
                    real = snapshot.match(namespace, key, scope).get("w", 0)
                    assert real // 16 * 16 <= got <= real, (tokens, scope)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def prompts(num: int) -> list[tuple[list[int], str, int]]:
    out = []
    for i in range(num):
        scope = ("tenant-a", "tenant-b")[i % 2]
        suffix = [100 + i, 101 + i * 7 % 50, 200 + i % 3] * (1 + i % 5)
        tokens = DOC[: 16 + 8 * (i % 5)] + suffix
        out.append((tokens, scope, min(16 * (i % 3), len(tokens) // 16 * 16)))
    return out


def test_index_from_live_events_is_a_fresh_snapshot_in_whole_blocks(worker_factory):
    worker = worker_factory(kv_cache_bytes="16MiB")
    asyncio.run(follow_and_compare(worker.url, prompts(12)))


def test_index_from_live_events_under_eviction_stays_within_a_block(worker_factory):
    worker = worker_factory(kv_cache_bytes="1MiB")
    many = prompts(10) + [([300 + i] * 40 + DOC, "tenant-a", 0) for i in range(16)]
    asyncio.run(follow_and_compare(worker.url, many))
    _, metrics = worker.get_json("/metrics")
    evicted = next(line for line in str(metrics).splitlines() if line.startswith("kv_evicted_blocks_total"))
    assert float(evicted.split()[-1]) > 0
