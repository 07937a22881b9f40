"""``/generate`` with ``render``: the worker writes the client's OpenAI answer itself
(what routers pass through), over HTTP against a real demo worker. The rendered
stream carries the same tokens, text and usage as the plain one, under the id,
created and model it was given; a resumed whole answer starts with the resumed
tokens' text and a resumed chat stream sends no second role."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from harness.procs import ManagedProcess, start_worker
from harness.sse import data_lines
from radix.openai.rendered import TOKENS_PREFIX, USAGE_PREFIX

# Its module-scoped processes start once: the whole module runs on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("worker_generate_render")]

PROMPT = list(range(60, 90))
SAMPLING = {"temperature": 1.0, "seed": 11, "max_tokens": 12, "ignore_eos": True}


@pytest.fixture(scope="module")
def worker() -> Iterator[ManagedProcess]:
    process = start_worker()
    yield process
    process.stop()


def render(endpoint: str = "completions", stream: bool = True, **extra: Any) -> dict[str, Any]:
    return {"endpoint": endpoint, "id": "cmpl-fixed", "created": 1234, "model": "served-as",
            "stream": stream, "include_usage": True, **extra}


def post(worker, token_ids: list[int], **fields: Any) -> tuple[int, Any]:
    return worker.post_json("/generate", {"token_ids": token_ids, "sampling": SAMPLING,
                                          "stream": True, **fields})


def plain_run(worker) -> tuple[list[int], list[str]]:
    """The plain stream's token ids, and the text each event (one token each) carried."""
    status, text = post(worker, PROMPT)
    assert status == 200
    events = [json.loads(frame) for frame in data_lines(text)
              if frame.startswith("{") and '"index"' in frame]
    assert all(len(e["token_ids"]) == 1 for e in events)
    return [e["token_ids"][0] for e in events], [e["text"] for e in events]


def rendered_lines(text: str) -> tuple[list[dict], list[dict], list[dict], list[str]]:
    """The tokens lines, the usage lines, the data objects and the raw data lines."""
    lines = text.split("\n")
    tokens = [json.loads(line[len(TOKENS_PREFIX):]) for line in lines
              if line.startswith(TOKENS_PREFIX.decode())]
    usage = [json.loads(line[len(USAGE_PREFIX):]) for line in lines
             if line.startswith(USAGE_PREFIX.decode())]
    data = data_lines(text)
    objects = [json.loads(d) for d in data if d != "[DONE]"]
    return tokens, usage, objects, data


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_a_rendered_stream_is_the_plain_run_in_openai_shape(worker, endpoint: str):
    token_ids, texts = plain_run(worker)
    text = "".join(texts)
    status, body = post(worker, PROMPT, render=render(endpoint))
    assert status == 200
    tokens, usage, objects, data = rendered_lines(body)
    assert [t for line in tokens for t in line["token_ids"]] == token_ids
    assert tokens[-1]["finish_reason"] == "length"
    assert data[-1] == "[DONE]" and objects[-1]["choices"] == []
    assert usage == [{"prompt_tokens": len(PROMPT), "completion_tokens": 12,
                      "cached_tokens": usage[0]["cached_tokens"]}]
    assert objects[-1]["usage"]["completion_tokens"] == 12
    assert {(o["id"], o["created"], o["model"]) for o in objects} == {
        ("cmpl-fixed", 1234, "served-as")}
    chunks = [o["choices"][0] for o in objects[:-1]]
    if endpoint == "chat":
        assert objects[0]["object"] == "chat.completion.chunk"
        assert chunks[0]["delta"]["role"] == "assistant"
        assert all("role" not in c["delta"] for c in chunks[1:])
        assert "".join(c["delta"].get("content", "") for c in chunks) == text
    else:
        assert objects[0]["object"] == "text_completion"
        assert "".join(c["text"] for c in chunks) == text


def test_a_rendered_whole_answer_comes_as_one_body_at_the_end(worker):
    text = "".join(plain_run(worker)[1])
    status, body = post(worker, PROMPT, render=render(stream=False))
    tokens, usage, objects, _ = rendered_lines(body)
    assert status == 200 and len(objects) == 1 and len(tokens) == 12 and len(usage) == 1
    whole = objects[0]
    assert whole["object"] == "text_completion" and whole["id"] == "cmpl-fixed"
    assert whole["choices"][0]["text"] == text
    assert whole["usage"]["completion_tokens"] == 12


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_a_resumed_rendered_answer_continues_the_run(worker, endpoint: str):
    token_ids, texts = plain_run(worker)
    text, first_text = "".join(texts), "".join(texts[:5])
    resumed = PROMPT + token_ids[:5]
    status, body = post(worker, resumed, num_resumed_tokens=5,
                        render=render(endpoint, stream=False))
    whole = rendered_lines(body)[2][0]
    content = whole["choices"][0]["message"]["content"] if endpoint == "chat" else \
        whole["choices"][0]["text"]
    assert status == 200 and content == text
    assert whole["usage"]["prompt_tokens"] == len(PROMPT)
    assert whole["usage"]["completion_tokens"] == 12
    status, body = post(worker, resumed, num_resumed_tokens=5, render=render(endpoint))
    tokens, _, objects, _ = rendered_lines(body)
    assert [t for line in tokens for t in line["token_ids"]] == token_ids[5:]
    chunks = [o["choices"][0] for o in objects[:-1]]
    if endpoint == "chat":
        assert any("role" in c["delta"] for c in chunks) == (not first_text)
        streamed = "".join(c["delta"].get("content", "") for c in chunks)
    else:
        streamed = "".join(c["text"] for c in chunks)
    assert first_text + streamed == text


@pytest.mark.parametrize(("fields", "param"), [
    ({"stream": False, "render": render()}, "render"),
    ({"render": render(endpoint="embeddings")}, "render.endpoint"),
    ({"render": render(created=-1)}, "render.created"),
    ({"render": render(colour="blue")}, "render.colour"),
    ({"render": {**render(), "id": None}}, "render.id"),
])
def test_a_bad_render_spec_is_a_400_naming_the_field(worker, fields, param):
    status, body = post(worker, PROMPT, **fields)
    assert status == 400 and body["error"]["param"] == param
