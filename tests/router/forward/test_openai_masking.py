"""An ``openai``-kind backend's details do not reach clients: streamed chunks carry
the router's model name (not the backend's, often a filesystem path), and a
backend's 4xx becomes the router's own error (the backend's text only in the log)."""

from __future__ import annotations

import json
import logging

import aiohttp
import pytest
from aiohttp import web

from harness import instant_upstream
from harness.sse import data_lines
from radix.openai.responses import sse_frame
from tests.support.aio import ALICE, running_router, scripted_stream, serving
from tests.support.router_configs import make_config
from tests.support.sse import STREAM

pytestmark = pytest.mark.anyio
BACKEND_MODEL = "/srv/models/qwen2.5-7b-instruct"


def backend(completions) -> web.Application:
    """An OpenAI-compatible backend serving ``BACKEND_MODEL``."""
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": BACKEND_MODEL}]})

    app = web.Application()
    app.add_routes([*instant_upstream.status_routes(), web.get("/v1/models", models),
                    web.post("/v1/completions", completions)])
    return app


def chunk(text: str, model: str = BACKEND_MODEL) -> bytes:
    return sse_frame({"id": "c", "object": "text_completion", "created": 0, "model": model,
                      "choices": [{"index": 0, "text": text, "finish_reason": None}]})


async def test_streamed_chunks_carry_the_routers_model_name() -> None:
    spaced = (b'data: {"id": "c", "object": "text_completion", "model": "/other/path", '
              b'"choices": [{"index": 0, "text": "\\"model\\":\\"x\\"", "finish_reason": null}]}'
              b"\n\n")
    pieces = [chunk("a"), chunk('"model":"/srv"'), spaced, b"data: [DONE]\n\n"]
    async with serving(backend(scripted_stream(pieces))) as up, \
            running_router(make_config([up], kind="openai")) as (url, _), \
            aiohttp.ClientSession() as session, \
            session.post(f"{url}/v1/completions", json=STREAM, headers=ALICE) as resp:
        text = await resp.text()
    chunks = [json.loads(line) for line in data_lines(text)[:-1]]
    assert [c["model"] for c in chunks] == ["demo"] * 3
    assert [c["choices"][0]["text"] for c in chunks] == ["a", '"model":"/srv"', '"model":"x"']
    assert "/srv/models" not in text and "/other/path" not in text


async def test_a_backend_refusal_is_our_own_error(caplog) -> None:
    async def refuse(request: web.Request) -> web.Response:
        return web.json_response({"error": {
            "message": f"This model's maximum context length is 32768 ({BACKEND_MODEL} on "
                       "vllm 0.9.1 at 10.0.0.7)", "type": "BadRequestError",
            "param": "max_tokens", "code": 400}}, status=400)

    caplog.set_level(logging.INFO, logger="router.forward.proxy")
    async with serving(backend(refuse)) as up, \
            running_router(make_config([up], kind="openai",  # it refuses the salt probe too
                                       worker={"trust_cache_salt": True})) as (url, _), \
            aiohttp.ClientSession() as session:
        for body in (STREAM, {**STREAM, "stream": False}):
            async with session.post(f"{url}/v1/completions", json=body, headers=ALICE) as resp:
                status, text, rid = resp.status, await resp.text(), resp.headers["X-Request-Id"]
            error = json.loads(text)["error"]
            assert status == 400 and error["param"] == "max_tokens", text
            assert error["code"] == "backend_refused" and "X-Request-Id" in error["message"]
            for detail in ("vllm", "10.0.0.7", "/srv/models", "32768"):
                assert detail not in text
            logged = [r.getMessage() for r in caplog.records if rid in r.getMessage()]
            assert any("10.0.0.7" in line for line in logged), logged
