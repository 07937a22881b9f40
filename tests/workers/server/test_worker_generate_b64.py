"""``POST /generate`` with ``token_ids_b64`` on a real worker process: the same
result as ``token_ids``, and clear 400s for every malformed encoding."""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Iterator

import pytest

from harness.procs import ManagedProcess, start_worker
from radix.keys import to_key
from tests.support.sse import sse_objects

# Its module-scoped processes start once: the whole module runs on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("worker_generate_b64")]

PROMPT = [5, 17, 200, 3, 99, 261, 0, 42]
# The demo model pads the tokenizer's 262 ids to a vocabulary of 320.
GREEDY = {"max_tokens": 4, "temperature": 0.0}


def b64(token_ids: list[int]) -> str:
    return base64.b64encode(to_key(token_ids)).decode()


@pytest.fixture(scope="module")
def worker() -> Iterator[ManagedProcess]:
    process = start_worker()
    yield process
    process.stop()


def stream_events(worker: ManagedProcess, body: dict[str, object]) -> list[dict[str, object]]:
    request = urllib.request.Request(
        f"{worker.url}/generate", data=json.dumps({**body, "stream": True}).encode(),
        headers={"Content-Type": "application/json"})
    raw = urllib.request.urlopen(request).read().decode()
    return [{k: v for k, v in event.items() if k != "request_id"} for event in sse_objects(raw)]


def test_b64_prompt_generates_what_the_id_list_does(worker):
    by_list = {"token_ids": PROMPT, "sampling": GREEDY, "scope": "s1"}
    by_b64 = {"token_ids_b64": b64(PROMPT), "sampling": GREEDY, "scope": "s2"}
    status_list, result_list = worker.post_json("/generate", by_list)
    status_b64, result_b64 = worker.post_json("/generate", by_b64)
    assert status_list == status_b64 == 200
    assert result_b64["usage"]["prompt_tokens"] == len(PROMPT)
    assert result_b64["choices"] == result_list["choices"]
    assert stream_events(worker, by_b64) == stream_events(worker, by_list)


@pytest.mark.parametrize(("body", "param", "message"), [
    ({"token_ids": PROMPT, "token_ids_b64": b64(PROMPT)}, "token_ids", "exactly one of"),
    ({"token_ids_b64": "not base64!"}, "token_ids_b64", "not valid base64"),
    ({"token_ids_b64": "AAAAA"}, "token_ids_b64", "not valid base64"),
    ({"token_ids_b64": base64.b64encode(b"\x05\x00\x00").decode()}, "token_ids_b64",
     "multiple of 4 bytes"),
    ({"token_ids_b64": ""}, "token_ids_b64", "non-empty base64 string"),
    ({"token_ids_b64": [1, 2]}, "token_ids_b64", "non-empty base64 string"),
    ({"token_ids_b64": b64([1, 320])}, "token_ids_b64", "token ids in [0, 320)"),
    ({"token_ids_b64": b64([1, 2**32 - 1])}, "token_ids_b64", "token ids in [0, 320)"),
    ({"token_ids_b64": b64([1, 2]), "num_public_tokens": 3}, "num_public_tokens", "[0, 2]"),
])
def test_malformed_b64_prompts_are_400_naming_the_field(worker, body, param, message):
    status, error = worker.post_json("/generate", body)
    assert status == 400, error
    assert error["error"]["param"] == param and message in error["error"]["message"]


def test_a_b64_prompt_over_the_context_is_413_naming_the_field(worker):
    _, ready = worker.get_json("/ready")
    body = {"token_ids_b64": b64([1] * ready["max_model_len"])}
    status, error = worker.post_json("/generate", body)
    assert status == 413 and error["error"]["param"] == "token_ids_b64"
