"""``/generate`` with ``num_resumed_tokens``: the continuation of a run from its
delivered tokens, over HTTP, and the refusals naming the field."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow
PROMPT = list(range(60, 90))


def generate(worker, token_ids, **fields):
    sampling = {"temperature": 1.0, "seed": 5, "max_tokens": 20, "ignore_eos": True,
                **fields.pop("sampling", {})}
    return worker.post_json("/generate", {"token_ids": token_ids, "sampling": sampling, **fields})


def test_a_resumed_generate_continues_the_run_and_reports_its_usage(worker_factory):
    worker = worker_factory()
    status, whole = generate(worker, PROMPT)
    assert status == 200
    tokens = whole["choices"][0]["token_ids"]
    status, resumed = generate(worker, PROMPT + tokens[:7], num_resumed_tokens=7)
    assert status == 200
    assert resumed["choices"][0]["token_ids"] == tokens[7:]
    assert resumed["usage"]["prompt_tokens"] == len(PROMPT)
    assert resumed["usage"]["completion_tokens"] == 20
    assert resumed["usage"]["cached_tokens"] <= len(PROMPT)
    status, body = generate(worker, PROMPT + tokens[:7], num_resumed_tokens=7,
                            sampling={"n": 2})
    assert status == 400 and body["error"]["param"] == "num_resumed_tokens"
    status, body = generate(worker, PROMPT + tokens, num_resumed_tokens=20)
    assert status == 400 and body["error"]["param"] == "num_resumed_tokens"
    status, body = generate(worker, PROMPT, num_resumed_tokens=len(PROMPT))
    assert status == 400 and body["error"]["param"] == "num_resumed_tokens"
