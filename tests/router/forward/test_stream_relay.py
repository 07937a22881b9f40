"""The router's relay of worker ``/generate`` streams (rendered by the worker, passed
through): events split or merged across network reads, error events, streams cut
short, and the exact chunk bytes; and the pass-through of an ``openai``-kind worker's
completions stream when it fails."""

from __future__ import annotations

import json

import aiohttp
import pytest
from aiohttp import web

from harness import instant_upstream
from harness.sse import data_lines
from radix.openai.rendered import RenderedAnswer, RenderSpec
from radix.openai.requests import CHAT, COMPLETIONS
from radix.openai.responses import ResponseShape, TokenUsage, sse_frame
from tests.support.aio import ALICE, eventually, running_router, scripted_stream, serving
from tests.support.router_configs import make_config
from tests.support.sse import STREAM, sse_objects

pytestmark = pytest.mark.anyio


SPEC = RenderSpec(COMPLETIONS, "cmpl-w", 7, "demo", True, True)


def event(text: str, reason: str | None = None) -> bytes:
    """One rendered step, as a worker writes it for ``SPEC``."""
    return RenderedAnswer(SPEC).step(0, [97], text, reason)


USAGE = RenderedAnswer(SPEC).end(TokenUsage(6, 3, 2))
WHOLE = event("a") + event("b") + event("c", "length") + USAGE + b"data: [DONE]\n\n"


def scripted_upstream(pieces: list[bytes]) -> web.Application:
    """An upstream whose ``/generate`` stream is ``pieces``."""
    app = web.Application()
    app.add_routes([*instant_upstream.status_routes(),
                    web.post("/generate", scripted_stream(pieces))])
    return app


async def relay(pieces: list[bytes], body: dict = STREAM) -> tuple[int, str]:
    async with serving(scripted_upstream(pieces)) as up, \
            running_router(make_config([up])) as (url, _), \
            aiohttp.ClientSession() as session, \
            session.post(f"{url}/v1/completions", json=body, headers=ALICE) as resp:
        return resp.status, await resp.text()


@pytest.mark.parametrize("cut", [1, 5, 17, 60, len(WHOLE) - 3])
async def test_events_split_anywhere_across_reads_relay_the_same(cut: int) -> None:
    whole_status, whole = await relay([WHOLE])
    bytewise = [WHOLE[i:i + cut] for i in range(0, len(WHOLE), cut)]
    split_status, split = await relay(bytewise)
    assert whole_status == split_status == 200
    strip = [{k: v for k, v in c.items() if k not in ("id", "created")}
             for c in sse_objects(whole)]
    assert [{k: v for k, v in c.items() if k not in ("id", "created")}
            for c in sse_objects(split)] == strip
    assert [c["choices"][0]["text"] for c in strip[:3]] == ["a", "b", "c"]
    assert strip[3]["usage"]["prompt_tokens_details"] == {"cached_tokens": 2}


async def test_comments_crlf_and_blank_lines_are_ignored() -> None:
    status, text = await relay([b": keep-alive\r\n\r\n", event("a").replace(b"\n", b"\r\n"),
                                b"\n\n", USAGE.replace(b"\n", b"\r\n"), b"data: [DONE]\r\n\r\n"])
    assert status == 200 and [c["choices"][0]["text"] for c in sse_objects(text)[:1]] == ["a"]


async def test_the_client_gets_the_workers_data_lines_byte_for_byte() -> None:
    status, text = await relay([WHOLE])
    assert status == 200
    assert text.encode() == b"".join(line + b"\n\n" for line in WHOLE.split(b"\n")
                                     if line.startswith(b"data: "))
    spec = RenderSpec(COMPLETIONS, "cmpl-w", 7, "demo", False, False)
    answer = RenderedAnswer(spec)
    pieces = [answer.step(0, [97], "a", None), answer.step(0, [98], "b", "length"),
              answer.end(TokenUsage(6, 2, 2)) + b"data: [DONE]\n\n"]
    status, text = await relay(pieces, {**STREAM, "stream": False})
    body = json.loads(text)
    assert status == 200 and body["id"] == "cmpl-w" and body["choices"][0]["text"] == "ab"
    assert text.encode() == pieces[-1].split(b"\n")[1][len(b"data: "):]


async def test_a_stream_without_usage_before_done_is_a_failed_attempt() -> None:
    status, text = await relay([event("a", "length"), b"data: [DONE]\n\n"])
    *frames, done = data_lines(text)
    assert status == 200 and json.loads(frames[0])["choices"][0]["text"] == "a"
    assert json.loads(frames[-1])["usage"]["completion_tokens"] == 1 and done == "[DONE]"


async def test_an_error_event_ends_the_stream_with_an_error_frame_and_done() -> None:
    error = sse_frame({"request_id": "r", "error": {"message": "boom", "code": "timeout"}})
    status, text = await relay([event("a") + error + event("never")])
    *frames, done = data_lines(text)
    assert status == 200 and json.loads(frames[0])["choices"][0]["text"] == "a"
    assert len(frames) == 2 and done == "[DONE]"
    relayed = json.loads(frames[1])["error"]
    assert relayed["code"] == "timeout" and "boom" not in relayed["message"]


async def test_a_stream_cut_short_ends_with_an_error_frame_and_done() -> None:
    status, text = await relay([event("a"), event("b")[:9]])
    *frames, done = data_lines(text)
    assert status == 200 and json.loads(frames[0])["choices"][0]["text"] == "a"
    error = json.loads(frames[1])["error"]
    assert len(frames) == 2 and done == "[DONE]" and error["code"] == "upstream_error"
    assert "[DONE]" not in error["message"], "no exception text reaches the client"


async def test_a_stream_ending_in_an_error_frame_is_counted_as_a_502() -> None:
    async with serving(scripted_upstream([event("a"), event("b")[:9]])) as up, \
            running_router(make_config([up])) as (url, router), \
            aiohttp.ClientSession() as session:
        async with session.post(f"{url}/v1/completions", json=STREAM, headers=ALICE) as resp:
            assert resp.status == 200 and "error" in await resp.text()
        failed = router.metrics.requests.labels("u0", "alice", "502")
        await eventually(lambda: failed._value.get() == 1, 5.0)
async def test_a_stream_without_events_is_a_failed_attempt() -> None:
    status, text = await relay([b"data: [DONE]\n\n"])
    assert status == 502 and json.loads(text)["error"]["code"] == "upstream_error"


@pytest.mark.parametrize("endpoint", [COMPLETIONS, CHAT])
def test_chunk_bytes_are_the_compact_json_of_the_envelope(endpoint: str) -> None:
    shape = ResponseShape(endpoint, "demo")
    for reason in (None, "length"):
        chunk = shape.chunk(1, 'a"é\n', reason)
        assert chunk.startswith(b"data: ") and chunk.endswith(b"\n\n")
        body = json.loads(chunk[6:])
        assert chunk == sse_frame(body)
        assert body["choices"][0]["index"] == 1 and body["model"] == "demo"
        if endpoint == CHAT:
            assert body["object"] == "chat.completion.chunk"
            assert body["choices"][0]["delta"]["content"] == 'a"é\n'
        else:
            assert body["object"] == "text_completion" and body["choices"][0]["text"] == 'a"é\n'


# ---- openai-kind workers: completions streams pass through --------------------------


def completion_chunk(text: str) -> bytes:
    return sse_frame({"id": "c", "object": "text_completion", "created": 0, "model": "m",
                      "choices": [{"index": 0, "text": text, "finish_reason": None}]})


def scripted_openai_upstream(pieces: list[bytes]) -> web.Application:
    """An OpenAI-compatible upstream whose ``/v1/completions`` stream is ``pieces``."""
    app = web.Application()
    app.add_routes([*instant_upstream.status_routes(),
                    web.get("/v1/models", instant_upstream.models),
                    web.post("/v1/completions", scripted_stream(pieces))])
    return app


async def relay_openai(pieces: list[bytes]) -> tuple[int, str]:
    async with serving(scripted_openai_upstream(pieces)) as up, \
            running_router(make_config([up], kind="openai")) as (url, _), \
            aiohttp.ClientSession() as session, \
            session.post(f"{url}/v1/completions", json=STREAM, headers=ALICE) as resp:
        return resp.status, await resp.text()


BACKEND_ERROR = sse_frame({"error": {"message": "Traceback: 10.0.0.7:8000 exploded",
                                     "type": "InternalServerError", "code": 500}})
VLLM_ERROR = sse_frame({"object": "error", "message": "CUDA error at 10.0.0.7:8000",
                        "type": "InternalServerError", "code": 500})


async def test_an_openai_stream_passes_through_to_its_done() -> None:
    status, text = await relay_openai([completion_chunk("a"), completion_chunk("b"),
                                       b"data: [DONE]\n\n"])
    assert status == 200 and data_lines(text)[-1] == "[DONE]"
    assert [json.loads(f)["choices"][0]["text"] for f in data_lines(text)[:-1]] == ["a", "b"]


@pytest.mark.parametrize("ending", [[], [BACKEND_ERROR, b"data: [DONE]\n\n"],
                                    [VLLM_ERROR, completion_chunk("never")]])
async def test_an_openai_stream_that_fails_ends_with_our_error_frame_and_done(ending) -> None:
    """Cut short without ``[DONE]``, or an error event from the backend: the client gets
    the router's own error frame (no backend text, no address) and then ``[DONE]``."""
    status, text = await relay_openai([completion_chunk("a"), *ending])
    *frames, done = data_lines(text)
    assert status == 200 and json.loads(frames[0])["choices"][0]["text"] == "a"
    error = json.loads(frames[1])["error"]
    assert len(frames) == 2 and done == "[DONE]" and error["code"] == "upstream_error"
    assert "10.0.0.7" not in text and "Traceback" not in text and "CUDA" not in text
