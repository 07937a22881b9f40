"""``router.forward.passthrough`` against a brute-force model that parses every chunk:
the same bytes to the client, the same usage noted and the same failures, whatever
the chunks hold (usage absent, null or counted, choices or none, compact or spaced
JSON, CRLF) and however the lines are split across network reads."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from radix.openai.responses import DONE_FRAME
from router.forward.masking import ModelRenamer
from router.forward.passthrough import CompletionPassthrough
from router.forward.relay import Exchange, note_usage

OURS, BACKEND = "demo", "/models/backend"
USAGE = {"prompt_tokens": 5, "completion_tokens": 3,
         "prompt_tokens_details": {"cached_tokens": 2}}


def chunk_line(choices: bool, usage: str, model: str, spaced: bool, error: bool) -> bytes:
    chunk: dict = {"id": "c", "object": "text_completion", "model": model,
                   "choices": [{"index": 0, "text": 'say "usage"', "finish_reason": None}]
                   if choices else []}
    if usage != "absent":
        chunk["usage"] = None if usage == "null" else USAGE
    if error:
        chunk = {"error": {"message": "boom", "code": 500}}
    return b"data: " + (json.dumps(chunk).encode() if spaced else orjson.dumps(chunk))


events = st.lists(st.builds(
    chunk_line, st.booleans(), st.sampled_from(["absent", "null", "counted"]),
    st.sampled_from([BACKEND, "other"]), st.booleans(), st.just(False))
    | st.builds(chunk_line, st.just(True), st.just("absent"), st.just(BACKEND), st.just(False),
                st.just(True)), max_size=6)


def stream_lines(chunks: list[bytes], crlf: bool, done: bool) -> list[bytes]:
    end = b"\r" if crlf else b""
    lines = [line + end for chunk in chunks for line in (chunk, b"")]
    return lines + ([b"data: [DONE]" + end, b""] if done else [])


def model(lines: list[bytes], include_usage: bool) -> tuple[bytes, int | None, bool, bool]:
    """Every chunk parsed, and read unless it has choices and no usage key (as the
    router always did): (bytes out, cached tokens noted, done, failed)."""
    rename = ModelRenamer(OURS, BACKEND)
    exchange, out, skip = Exchange(200), [], False
    for line in lines:
        if skip:
            skip = False
            continue
        if line.startswith(b"data: {"):
            line = rename(line)
            chunk = orjson.loads(line[6:])
            if "choices" in chunk and "usage" not in chunk:
                out.append(line + b"\n")
                continue
            if "error" in chunk:
                return b"".join(out), exchange.num_cached_tokens, False, True
            note_usage(exchange, chunk.get("usage"))
            if not chunk.get("choices") and not include_usage:
                skip = True
                continue
        elif line.rstrip() == b"data: [DONE]":
            return b"".join(out) + DONE_FRAME, exchange.num_cached_tokens, True, False
        out.append(line + b"\n")
    return b"".join(out), exchange.num_cached_tokens, False, False


@given(events, st.booleans(), st.booleans(), st.booleans(), st.lists(st.integers(0, 20)))
def test_the_client_gets_what_parsing_every_chunk_would_give(
        chunks: list[bytes], include_usage: bool, crlf: bool, done: bool,
        cuts: list[int]) -> None:
    lines = stream_lines(chunks, crlf, done)
    stream = CompletionPassthrough(OURS, BACKEND, include_usage)
    exchange, out, finished, failed = Exchange(200), [], False, False
    bounds = sorted({0, len(lines), *(c for c in cuts if c < len(lines))})
    try:
        for start, end in zip(bounds, bounds[1:], strict=False):
            if stream.feed(lines[start:end], out, exchange):
                finished = True
                break
    except ValueError:
        failed = True
    assert (b"".join(out), exchange.num_cached_tokens, finished, failed) == model(
        lines, include_usage)


@pytest.mark.parametrize("spaced", [False, True])
def test_plain_chunks_count_a_token_each_until_the_usage_says(spaced: bool) -> None:
    stream = CompletionPassthrough(OURS, BACKEND, False)
    exchange, out = Exchange(200), []
    plain = [chunk_line(True, usage, BACKEND, spaced, False) for usage in ("absent", "null")]
    stream.feed(stream_lines(plain, False, False), out, exchange)
    assert exchange.num_completion_tokens == 2
    stream.feed(stream_lines([chunk_line(False, "counted", BACKEND, spaced, False)], False,
                             True), out, exchange)
    assert (exchange.num_completion_tokens, exchange.num_cached_tokens) == (3, 2)
