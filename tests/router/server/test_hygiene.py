"""What clients and admins can see and do at the edges: request ids, error bodies,
Retry-After, worker saturation, the admin rules for added workers, and tokens charged
for a stream the client cuts."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import aiohttp
import pytest
from aiohttp import web

from harness import instant_upstream
from radix.openai.rendered import rendered_answer
from router.config import WorkerSpec
from tests.support.aio import (
    ADMIN,
    ALICE,
    call,
    eventually,
    failing_upstream,
    key_recording_upstream,
    running_router,
    serving,
)
from tests.support.router_configs import make_config

pytestmark = pytest.mark.anyio
PROMPT = {"model": "demo", "prompt": "hello"}


async def test_every_response_carries_a_request_id_echoing_a_valid_one() -> None:
    async with serving(instant_upstream.create_app()) as up, \
            running_router(make_config([up])) as (url, _), aiohttp.ClientSession() as session:
        for headers, expected in [({"X-Request-Id": "trace-1:a.b_c"}, "trace-1:a.b_c"),
                                  ({"X-Request-Id": "x" * 129}, None),
                                  ({"X-Request-Id": "bad id\u00e9"}, None), ({}, None)]:
            for auth in (ALICE, {}):  # served and refused alike
                _, _, got = await call(session, "POST", f"{url}/v1/completions",
                                       {**PROMPT, "stream": True}, {**auth, **headers})
                rid = got["X-Request-Id"]
                assert rid == expected if expected else len(rid) == 32 and rid.isalnum()
        status, _, got = await call(session, "GET", f"{url}/nowhere")
        assert status == 404 and got["X-Request-Id"]


async def test_saturated_workers_are_a_503_with_retry_after() -> None:
    async with serving(failing_upstream(429)) as a, serving(failing_upstream(429)) as b, \
            running_router(make_config([a, b])) as (url, _), aiohttp.ClientSession() as session:
        status, error, headers = await call(session, "POST", f"{url}/v1/completions", PROMPT,
                                            ALICE)
        assert status == 503 and headers["Retry-After"] == "1"
        assert error["error"]["code"] == "saturated" and "boom" not in str(error)


async def test_admin_added_workers_take_keys_only_from_their_own_variable(caplog, monkeypatch
                                                                          ) -> None:
    monkeypatch.setenv("RADIX_WORKER_KEY_LATE", "late-key")
    monkeypatch.setenv("RADIX_WORKER_KEY_OTHER", "other-key")
    caplog.set_level(logging.INFO, logger="router.admin")
    async with serving(instant_upstream.create_app()) as up, \
            running_router(make_config([])) as (url, router), aiohttp.ClientSession() as session:
        async def add(**worker: str) -> tuple[int, dict]:
            body = {"action": "add", "worker": {"id": "late", "model": "demo", "url": up,
                                                **worker}}
            status, result, _ = await call(session, "POST", f"{url}/admin/workers", body, ADMIN)
            return status, result

        only_own = "may read only 'RADIX_WORKER_KEY_LATE'"
        for worker, message in [
                ({"api_key_env": "RADIX_ROUTER_SECRET"}, only_own),
                ({"api_key_env": "RADIX_WORKER_KEY_OTHER"}, only_own),
                ({"id": "LATE", "api_key_env": "RADIX_WORKER_KEY_LATE"}, "lower-case"),
                ({"id": "unset", "api_key_env": "RADIX_WORKER_KEY_UNSET"}, "is not set"),
                ({"api_key_env": "RADIX WORKER"}, "environment variable name"),
                ({"url": "ftp://h:1"}, "http:// or https://"),
                ({"url": "http://:80"}, "with a host"),
                ({"url": "http://h:0"}, "port 1-65535"),
                ({"url": "http://h:99999"}, "not a valid URL"),
                ({"url": "http://user:pw@h:1"}, "no user info"),
                ({"url": "http://h:1/?q=1"}, "query")]:
            status, error = await add(**worker)
            assert status == 400 and message in error["error"]["message"], (worker, error)
        assert router.registry.workers() == []
        status, added = await add(api_key_env="RADIX_WORKER_KEY_LATE")
        assert status == 200 and router.registry.get("late").headers == {
            "Authorization": "Bearer late-key"}
        await call(session, "POST", f"{url}/admin/workers", {"action": "remove", "id": "late"},
                   ADMIN)
    changes = [r.getMessage() for r in caplog.records if r.name == "router.admin"]
    assert len(changes) == 2 and "127.0.0.1" in changes[0] and "late-key" not in str(changes)
    assert "added worker late" in changes[0] and "RADIX_WORKER_KEY_LATE" in changes[0]
    assert "removed worker late" in changes[1]


async def test_an_admin_cannot_send_a_config_workers_key_elsewhere(monkeypatch) -> None:
    """The exfiltration of issue 27: an admin-added worker naming w0's variable (under
    another id, a case variant of w0's, or w0's own id after removing it) gets 400, and
    the host it names never sees w0's key."""
    monkeypatch.setenv("RADIX_WORKER_KEY_W0", "w0-key")
    seen: list[str] = []
    async with serving(instant_upstream.create_app()) as up, \
            serving(key_recording_upstream(seen)) as elsewhere:
        config = make_config([])
        config = replace(config, workers=(WorkerSpec(worker_id="w0", model="demo", url=up,
                                                       api_key_env="RADIX_WORKER_KEY_W0"),))
        async with running_router(config) as (url, _), aiohttp.ClientSession() as session:
            async def add(worker_id: str) -> tuple[int, dict]:
                worker = {"id": worker_id, "model": "demo", "url": elsewhere,
                          "api_key_env": "RADIX_WORKER_KEY_W0"}
                status, result, _ = await call(session, "POST", f"{url}/admin/workers",
                                               {"action": "add", "worker": worker}, ADMIN)
                return status, result

            assert (await add("x"))[0] == 400
            assert (await add("W0"))[0] == 400
            await call(session, "POST", f"{url}/admin/workers", {"action": "remove", "id": "w0"},
                       ADMIN)
            status, error = await add("w0")
            assert status == 400 and "belongs to config worker 'w0'" in error["error"]["message"]
            await asyncio.sleep(0.5)  # five poll intervals
    assert "Bearer w0-key" not in seen


def stalling_upstream(num_events: int, sent: asyncio.Event) -> web.Application:
    """``/generate`` streams ``num_events`` one-token events, then waits forever."""
    async def generate(request: web.Request) -> web.StreamResponse:
        answer = rendered_answer(await request.json())
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for _ in range(num_events):
            await out.write(answer.step(0, [97], "a", None))
        sent.set()
        await asyncio.sleep(3600)
        return out

    app = web.Application()
    app.add_routes([*instant_upstream.status_routes(), web.post("/generate", generate)])
    return app


async def test_a_decoding_request_no_longer_counts_as_queued_prefill() -> None:
    """In flight: the request until it ends, its prompt tokens only until the first
    token (the worker's prefill is done), so the policy sees a decode, not a queue."""
    sent = asyncio.Event()
    async with serving(stalling_upstream(2, sent)) as up, \
            running_router(make_config([up])) as (url, router):
        body = {**PROMPT, "max_tokens": 40, "stream": True}
        async with aiohttp.ClientSession() as session, \
                session.post(f"{url}/v1/completions", json=body, headers=ALICE) as resp:
            while not (await resp.content.readline()).startswith(b"data: {"):
                pass
            worker = router.registry.get("u0")
            assert worker.num_in_flight_requests == 1
            assert worker.num_in_flight_prompt_tokens == 0
        await eventually(lambda: router.registry.get("u0").num_in_flight_requests == 0)


async def test_a_stream_the_client_cuts_is_charged_for_what_it_received() -> None:
    sent = asyncio.Event()
    async with serving(stalling_upstream(5, sent)) as up, \
            running_router(make_config([up], tokens_per_minute=10_000)) as (url, router):
        num_prompt = len(router.models.get("demo").tokenizer.encode("hello"))
        body = {**PROMPT, "max_tokens": 40, "n": 2, "stream": True}
        async with aiohttp.ClientSession() as session, \
                session.post(f"{url}/v1/completions", json=body, headers=ALICE) as resp:
            chunks = 0
            while chunks < 5:
                chunks += (await resp.content.readline()).startswith(b"data: {")
            await sent.wait()
            assert await router.limiter.tokens_in_window("alice") == num_prompt + 40 * 2
        await eventually(lambda: router.registry.get("u0").num_in_flight_requests == 0)
        assert await router.limiter.tokens_in_window("alice") == num_prompt + 5
