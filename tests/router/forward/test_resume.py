"""Failures of a worker mid-answer, in process: a stream cut (closed, reset, or gone
silent past the idle timeout) continues on the next worker from the delivered tokens;
a worker that never answers trips the first-byte timeout; what cannot be resumed ends
with an error event and ``[DONE]``."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from harness import instant_upstream
from harness.sse import data_lines
from radix.keys import from_key
from radix.openai.rendered import rendered_answer
from radix.openai.responses import TokenUsage, sse_frame
from router.config_toml import parse_config
from tests.support.aio import ALICE, NOTHING_CACHED, running_router, serving
from tests.support.router_configs import auth_section, model_table, worker_list
from tests.support.sse import sse_objects

pytestmark = pytest.mark.anyio
DELIVERED = [(101, "e"), (102, "f")]
MAX_TOKENS = 5


def config(urls: list[str], kind: str = "radix"):
    return parse_config({
        "models": {"demo": model_table()},
        "workers": worker_list({f"u{i}": url for i, url in enumerate(urls)}, kind=kind),
        "policy": {"name": "round_robin"},
        "registry": {"poll_interval_s": 0.1},
        "proxy": {"first_byte_timeout_s": 1.0, "idle_timeout_s": 0.5},
        "auth": auth_section({"alice": {}}, admin=False),
    })


Step = tuple[int, str, int, str | None]  # token id, text, choice index, finish reason


def delta(token_id: int, text: str, index: int = 0, reason: str | None = None) -> Step:
    return token_id, text, index, reason


def failing_upstream(how: str, steps: list[Step]) -> web.Application:
    """``/generate`` sends ``steps`` rendered, then fails ``how``: ``close`` (ends the
    body without ``[DONE]``), ``reset`` (drops the connection), ``stall`` (goes
    silent), ``hang`` (sends nothing at all, not even headers), ``half_event`` (sends a
    next step's ``tokens`` line alone, then drops the connection), ``garbled`` (sends
    a next step whole and a malformed line in one write, then drops the connection)."""
    async def generate(request: web.Request) -> web.StreamResponse:
        answer = rendered_answer(await request.json())
        if how == "hang":
            await asyncio.sleep(60)
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for token_id, text, index, reason in steps:
            await out.write(answer.step(index, [token_id], text, reason))
        if how == "stall":
            await asyncio.sleep(60)
        if how == "half_event":
            tokens_line = answer.step(0, [101 + len(steps)], "never", None).split(b"\n")[0]
            await out.write(tokens_line + b"\n")
            await asyncio.sleep(0.1)
        if how == "garbled":
            await asyncio.sleep(0.1)
            await out.write(answer.step(0, [101 + len(steps)], "never", None)
                            + b"data: {garbled\n\n")
            await asyncio.sleep(0.1)
        if how in ("reset", "half_event", "garbled"):
            assert request.transport is not None
            request.transport.abort()
        return out

    app = web.Application()
    app.add_routes([*instant_upstream.status_routes("bad"), web.post("/generate", generate)])
    return app


def continuing_upstream(seen: list[dict[str, Any]]) -> web.Application:
    """``/generate`` as a resuming worker answers: token 101 + i with text "e", "f", ...
    (from the first token after the resumed ones) until ``max_tokens`` counting the
    resumed tokens, usage of the whole run, a whole body starting with the resumed
    tokens' text."""
    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        prompt = from_key(base64.b64decode(body["token_ids_b64"]))
        num_resumed = body.get("num_resumed_tokens", 0)
        max_tokens = body["sampling"]["max_tokens"]
        answer = rendered_answer(body, "".join(chr(ord("e") + i) for i in range(num_resumed)))
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for i in range(num_resumed, max_tokens):
            await out.write(answer.step(0, [101 + i], chr(ord("e") + i),
                                        "length" if i == max_tokens - 1 else None))
        usage = TokenUsage(len(prompt) - num_resumed, max_tokens, 0)
        await out.write(answer.end(usage) + b"data: [DONE]\n\n")
        return out

    app = web.Application()
    app.add_routes([*instant_upstream.status_routes("good"), web.post("/generate", generate)])
    return app


async def ask(how: str, body: dict[str, Any], steps: list[Step] | None = None
              ) -> tuple[int, str, list[dict[str, Any]], float]:
    seen: list[dict[str, Any]] = []
    steps = [delta(t, s) for t, s in DELIVERED] if steps is None else steps
    async with serving(failing_upstream(how, steps)) as bad, \
            serving(continuing_upstream(seen)) as good, \
            running_router(config([bad, good])) as (url, _), \
            aiohttp.ClientSession() as session:
        started = time.monotonic()
        async with session.post(f"{url}/v1/completions", json=body, headers=ALICE) as resp:
            return resp.status, await resp.text(), seen, time.monotonic() - started


REQUEST = {"model": "demo", "prompt": "hello", "max_tokens": MAX_TOKENS}
STREAM = {**REQUEST, "stream": True, "stream_options": {"include_usage": True}}


@pytest.mark.parametrize("how", ["close", "reset", "stall"])
async def test_a_stream_cut_mid_way_resumes_on_the_next_worker(how: str) -> None:
    status, text, seen, _ = await ask(how, STREAM)
    chunks = sse_objects(text)
    assert status == 200
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == "efghi"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert len(seen) == 1 and seen[0]["num_resumed_tokens"] == len(DELIVERED)
    resumed_prompt = from_key(base64.b64decode(seen[0]["token_ids_b64"]))
    assert resumed_prompt[-3:] == [*b"o", 101, 102]
    assert seen[0]["sampling"]["max_tokens"] == MAX_TOKENS
    assert chunks[-1]["usage"]["prompt_tokens"] == len(resumed_prompt) - len(DELIVERED)
    assert chunks[-1]["usage"]["completion_tokens"] == MAX_TOKENS
    assert len({(c["id"], c["created"]) for c in chunks}) == 1, "one answer across workers"
    assert seen[0]["render"]["id"] == chunks[0]["id"]


@pytest.mark.parametrize("how", ["half_event", "garbled"])
async def test_a_step_the_client_did_not_get_is_generated_again(how: str) -> None:
    """Cut between its ``tokens`` and ``data`` lines, or read whole together with a
    malformed line (which fails the read): either way the next worker resumes after
    the steps the client has, and generates that one again."""
    status, text, seen, _ = await ask(how, STREAM)
    chunks = sse_objects(text)
    assert status == 200
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == "efghi"
    assert seen[0]["num_resumed_tokens"] == len(DELIVERED)
    assert chunks[-1]["usage"]["completion_tokens"] == MAX_TOKENS


async def test_a_whole_answer_resumes_the_same_way() -> None:
    status, text, seen, _ = await ask("reset", REQUEST)
    body = json.loads(text)
    assert status == 200 and body["choices"][0]["text"] == "efghi"
    assert body["usage"]["completion_tokens"] == MAX_TOKENS
    assert seen[0]["num_resumed_tokens"] == len(DELIVERED)


async def test_a_hung_worker_trips_the_first_byte_timeout_and_another_answers() -> None:
    status, text, seen, elapsed = await ask("hang", STREAM)
    chunks = sse_objects(text)
    assert status == 200 and "".join(c["choices"][0]["text"] for c in chunks
                                     if c["choices"]) == "efghi"
    assert "num_resumed_tokens" not in seen[0]
    assert 1.0 <= elapsed < 5.0


async def test_a_stream_whose_choices_all_finished_completes_without_another_worker() -> None:
    steps = [delta(101, "e"), delta(102, "f", reason="stop")]
    status, text, seen, _ = await ask("reset", STREAM, steps)
    chunks = sse_objects(text)
    assert status == 200 and not seen
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == "ef"
    assert chunks[-1]["usage"]["completion_tokens"] == 2


async def test_n_above_one_is_not_resumed_after_the_first_byte() -> None:
    steps = [delta(101, "e", index=0), delta(102, "x", index=1)]
    status, text, seen, _ = await ask("reset", {**STREAM, "n": 2}, steps)
    frames_out = data_lines(text)
    assert status == 200 and not seen
    assert frames_out[-1] == "[DONE]"
    assert json.loads(frames_out[-2])["error"]["code"] == "upstream_error"


async def test_an_openai_worker_cut_mid_stream_ends_with_an_error_event() -> None:
    async def completions(request: web.Request) -> web.StreamResponse:
        if not (await request.json()).get("stream"):
            return web.json_response(NOTHING_CACHED)  # the salt probe
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        await out.write(sse_frame({"id": "c", "object": "text_completion", "created": 0,
                                   "model": "demo", "choices": [
                                       {"index": 0, "text": "a", "finish_reason": None}]}))
        assert request.transport is not None
        request.transport.abort()
        return out

    app = web.Application()
    app.add_routes([*instant_upstream.status_routes(), web.get("/v1/models", instant_upstream.models),
                    web.post("/v1/completions", completions)])
    async with serving(app) as up, running_router(config([up], kind="openai")) as (url, _), \
            aiohttp.ClientSession() as session, \
            session.post(f"{url}/v1/completions", json=STREAM, headers=ALICE) as resp:
        text = await resp.text()
    frames = data_lines(text)
    assert json.loads(frames[0])["choices"][0]["text"] == "a"
    assert json.loads(frames[-2])["error"]["code"] == "upstream_error" and frames[-1] == "[DONE]"
