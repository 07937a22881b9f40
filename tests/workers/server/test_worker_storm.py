"""A storm of malformed, cancelled and valid requests: never a 500, never a leaked block."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from harness.procs import start_worker
from tests.workers.server.worker_checks import metric, used_blocks_settle

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
BAD_REQUESTS: list[tuple[str, str, object]] = [
    ("POST", COMPLETIONS, b"{not json"),
    ("POST", COMPLETIONS, b"\xff\xfe\x00"),
    ("POST", COMPLETIONS, [1, 2]),
    ("POST", COMPLETIONS, {"prompt": 5}),
    ("POST", COMPLETIONS, {"prompt": []}),
    ("POST", COMPLETIONS, {"prompt": [-1]}),
    ("POST", COMPLETIONS, {"prompt": "x", "max_tokens": -5}),
    ("POST", COMPLETIONS, {"prompt": "x", "max_tokens": 1e30}),
    ("POST", COMPLETIONS, {"prompt": "x", "max_tokens": True}),
    ("POST", COMPLETIONS, {"prompt": "x", "max_tokens": 10**30}),
    ("POST", COMPLETIONS, {"prompt": "x", "temperature": "hot"}),
    ("POST", COMPLETIONS, {"prompt": "x", "top_k": -5}),
    ("POST", COMPLETIONS, {"prompt": "x", "n": 0}),
    ("POST", COMPLETIONS, {"prompt": "x", "stop": "x" * 1000}),
    ("POST", COMPLETIONS, {"prompt": "x", "stream_options": 5}),
    ("POST", COMPLETIONS, {"prompt": "x", "presence_penalty": 1}),
    ("POST", COMPLETIONS, {"model": 7, "prompt": "x"}),
    ("POST", COMPLETIONS, {"model": "other", "prompt": "x"}),
    ("POST", COMPLETIONS, {"prompt": "z" * 5000}),
    ("POST", CHAT, {"messages": "hi"}),
    ("POST", CHAT, {"messages": [{"role": "wizard", "content": "x"}]}),
    ("POST", CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
    ("POST", CHAT, {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}),
    ("POST", CHAT, {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}),
    ("POST", "/generate", {"token_ids": "abc"}),
    ("POST", "/generate", {"token_ids": [1, 2], "num_public_tokens": 1}),
    ("POST", "/generate", {"token_ids": [1, 2], "num_public_tokens": 32}),
    ("POST", "/generate", {"token_ids": [1, 2], "sampling": []}),
    ("POST", "/generate", {"token_ids": [1, 2], "sampling": {"seed": 2**70}}),
    ("POST", "/generate", {"token_ids": [1, 2], "sampling": {"top_p": float("nan")}}),
    ("POST", "/generate", {"token_ids": [1, 2], "sampling": {"stop_token_ids": [10**9]}}),
    ("POST", "/generate", {"token_ids": [1, 2], "scope": ""}),
    ("POST", "/generate", {"token_ids": [1, 2], "stream": "yes"}),
    ("GET", "/generate", None),
    ("GET", "/nope", None),
    ("POST", "/kv/events", None),
    ("GET", "/kv/events?since=abc", None),
]


async def send(session: aiohttp.ClientSession, url: str, method: str, path: str, body: object) -> int:
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    async with session.request(method, url + path, data=data) as response:
        payload = await response.json(content_type=None)
        assert set(payload["error"]) == {"message", "type", "param", "code"}, payload
        return response.status


async def cancel_mid_stream(session: aiohttp.ClientSession, url: str, i: int) -> None:
    body = {"token_ids": [i % 200] * (20 + i), "stream": True,
            "sampling": {"max_tokens": 300, "ignore_eos": True, "n": 1 + i % 3}}
    async with session.post(url + "/generate", json=body) as response:
        assert response.status == 200
        await response.content.readline()


async def cancel_by_timeout(session: aiohttp.ClientSession, url: str, i: int) -> None:
    body = {"prompt": "q" * (30 + i), "max_tokens": 300, "ignore_eos": True}
    timeout = aiohttp.ClientTimeout(total=0.05 + 0.02 * (i % 5))
    try:
        async with session.post(url + COMPLETIONS, json=body, timeout=timeout) as response:
            await response.read()
    except TimeoutError:
        return


async def complete_async(session: aiohttp.ClientSession, url: str, i: int) -> None:
    body = {"prompt": f"ok {i}", "max_tokens": 3, "ignore_eos": True}
    async with session.post(url + COMPLETIONS, json=body) as response:
        assert response.status == 200
        assert (await response.json())["usage"]["completion_tokens"] == 3


async def storm(url: str) -> list[int]:
    async with aiohttp.ClientSession() as session:
        bad = [send(session, url, *request) for request in BAD_REQUESTS * 2]
        cancelled = [cancel_mid_stream(session, url, i) for i in range(12)]
        cancelled += [cancel_by_timeout(session, url, i) for i in range(12)]
        good = [complete_async(session, url, i) for i in range(6)]
        results = await asyncio.gather(*bad, *cancelled, *good)
        return [status for status in results[: len(bad)]]


def test_storm_never_500s_and_never_leaks_a_block():
    worker = start_worker(kv_cache_bytes="2MiB")  # 31 blocks: the storm also preempts
    try:
        baseline = used_blocks_settle(worker)
        statuses = asyncio.run(storm(worker.url))
        assert all(400 <= status < 500 for status in statuses), statuses
        assert {413, 404, 405, 400} <= set(statuses)
        info = used_blocks_settle(worker)
        kv = info["kv"]
        assert kv["num_free_blocks"] + kv["num_cached_blocks"] == baseline["kv"]["num_total_blocks"]
        assert metric(worker, "http_unhandled_exceptions_total") == 0
    finally:
        worker.stop()
    assert "Traceback" not in worker.log_text()
