"""Untrusted input end to end: a router process in front of real demo workers.

One router serves three models: ``demo`` on two radix workers (the fuzz target),
``solo`` on a third radix worker, and ``salted``, the same third worker registered
as ``kind = "openai"`` (reached through its OpenAI routes with the tenant's
``cache_salt``). Checks: generated junk never gets a 5xx from the router or a
worker and leaks no block while valid traffic keeps being served; the router and a
worker answer the same bodies with the same status, ``param`` and shape; a tenant
probing another tenant's private prompt sees no more cached tokens than the public
part, on radix and on openai-kind workers; oversized prompts are refused by their
character count before tokenizing.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.procs import ManagedProcess, start_router, start_worker
from harness.sse import data_lines
from radix.tokenizer import PromptTokenizer
from tests.support.polling import wait_until
from tests.support.router_configs import ALICE, BOB, auth_section, model_table, to_toml, worker_list

# Its module-scoped processes start once: the whole module runs on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e_untrusted_input")]
SYSTEM = "You are a careful assistant. Answer from the document only. " * 2
BLOCK_SIZE = 16
MAX_OUTPUT_TOKENS = 8


def router_config(demo: list[str], solo: str) -> str:
    """TOML: the three models (each with the public system prompt), tenants alice and
    bob, fast polling."""
    limits = {"max_prompt_tokens": 2048, "max_output_tokens": MAX_OUTPUT_TOKENS}
    return to_toml({
        "registry": {"poll_interval_s": 0.2, "probe_timeout_s": 2.0},
        "models": {model: model_table(system=SYSTEM) for model in ("demo", "solo", "salted")},
        "auth": auth_section({"alice": limits, "bob": limits}, admin=False),
        "workers": [*worker_list({f"d{i}": url for i, url in enumerate(demo)}, kind="radix"),
                    *worker_list({"s-radix": solo}, model="solo", kind="radix"),
                    *worker_list({"s-openai": solo}, model="salted", kind="openai")],
    })


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[ManagedProcess, list[ManagedProcess]]]:
    workers = [start_worker(kv_cache_bytes="8MiB", wait=False) for _ in range(3)]
    router = None
    try:
        for worker in workers:
            worker.wait_ready(120)
        path = tmp_path_factory.mktemp("router") / "router.toml"
        path.write_text(router_config([w.url for w in workers[:2]], workers[2].url))
        router = start_router(path)
        wait_until(lambda: all(post(router, "/v1/completions", {"model": m, "prompt": "hi",
                                                                 "max_tokens": 1})[0] == 200
                               for m in ("demo", "solo", "salted")), 60, interval_s=0.2)
        yield router, workers
    finally:
        if router is not None:
            router.stop()
            assert "Traceback" not in router.log_text()
        for worker in workers:
            worker.stop()
            assert "Traceback" not in worker.log_text()


def post_raw(url: str, raw: bytes, key: str | None = ALICE) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=raw, method="POST",
                                     headers={"Content-Type": "application/json"})
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def post(process: ManagedProcess, path: str, body: object, key: str | None = ALICE
         ) -> tuple[int, Any]:
    status, raw = post_raw(f"{process.url}{path}", json.dumps(body).encode(), key)
    if raw.startswith(b"data: "):
        return status, [json.loads(frame) for frame in data_lines(raw.decode())
                        if frame.startswith("{")]
    return status, json.loads(raw)


# ---- generated junk --------------------------------------------------------------

EDGE_TEXT = st.lists(st.one_of(st.characters(), st.sampled_from(
    ["\ud800", "\udfff", "\x00", "\u202e", "\ufeff", "\U0010ffff", "<|end|>", "<|system|>"])),
    max_size=24).map("".join)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.floats(), EDGE_TEXT,
    st.sampled_from([0, -1, -2**63 - 1, 2**63, 2**64, 10**30, 2**20 + 1, 9223372036854775808]))
JUNK = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=10)
MESSAGE = st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["system", "user", "assistant", "tool"]), JUNK),
     "content": st.one_of(EDGE_TEXT, JUNK)},
    optional={"name": JUNK, "tool_calls": JUNK})
OPTIONAL_FIELDS = {
    "prompt": st.one_of(EDGE_TEXT, st.lists(st.integers(-3, 300), max_size=6), JUNK),
    "messages": st.one_of(st.lists(MESSAGE, max_size=3), JUNK),
    "temperature": st.one_of(st.floats(0, 2), JUNK), "top_p": st.one_of(st.floats(0, 1), JUNK),
    "top_k": st.one_of(st.integers(-2, 300), JUNK), "seed": st.one_of(st.integers(-1, 2**64), JUNK),
    "n": st.one_of(st.integers(0, 3), JUNK), "ignore_eos": st.one_of(st.just(True), JUNK),
    "stop": st.one_of(st.lists(st.text(max_size=3), max_size=40), JUNK),
    "stop_token_ids": st.one_of(st.lists(st.integers(-1, 300), max_size=70), JUNK),
    "stream": st.one_of(st.booleans(), JUNK),
    "stream_options": st.one_of(st.fixed_dictionaries({}, optional={"include_usage": JUNK}), JUNK),
    "max_completion_tokens": JUNK, "logprobs": JUNK, "tools": JUNK, "cache_salt": JUNK,
    "response_format": JUNK, "best_of": JUNK, "presence_penalty": JUNK, "user": JUNK,
}
BODIES = st.tuples(
    st.fixed_dictionaries({"model": st.one_of(st.just("demo"), JUNK),
                           "max_tokens": st.one_of(st.integers(1, 4),
                                                   JUNK.filter(lambda v: v is not None))},
                          optional=OPTIONAL_FIELDS),
    st.dictionaries(st.text(min_size=1, max_size=8), JUNK, max_size=2),
).map(lambda parts: {**parts[1], **parts[0]})
VALID_FIELDS = {
    "temperature": st.floats(0, 2), "top_p": st.floats(0, 1, exclude_min=True),
    "top_k": st.integers(-1, 262), "seed": st.integers(0, 2**63 - 1), "n": st.integers(1, 2),
    "stop": st.lists(st.text(min_size=1, max_size=3), max_size=16),
    "stream": st.booleans(), "ignore_eos": st.booleans(),
}


@st.composite
def requests(draw) -> tuple[str, bytes]:
    """A target path and a body: junk, or a valid request with at most one field swapped
    for junk (so both valid and refused requests reach the engine's neighbourhood)."""
    path = draw(st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
    kind = draw(st.sampled_from(["junk", "valid", "near"]))
    if kind == "junk":
        raw = draw(st.one_of(
            BODIES.map(lambda body: json.dumps(body).encode()),  # surrogates become \ud800
            st.binary(max_size=40),
            st.integers(1, 5).map(lambda k: b'{"model": "demo", "prompt": ' + b"[" * 10**k
                                  + b"]" * 10**k + b"}")))
        return path, raw
    body: dict[str, Any] = {"model": "demo", "max_tokens": draw(st.integers(1, 4))}
    if path == "/v1/completions":
        body["prompt"] = draw(st.one_of(EDGE_TEXT.filter(bool), st.lists(st.integers(0, 261),
                                                                         min_size=1, max_size=6)))
    else:
        body["messages"] = [{"role": "user", "content": draw(EDGE_TEXT)}]
    body.update(draw(st.fixed_dictionaries({}, optional=VALID_FIELDS)))
    if kind == "near":
        name = draw(st.sampled_from(sorted({*OPTIONAL_FIELDS, "max_tokens"})))
        body[name] = draw(JUNK.filter(lambda value: value is not None))
    return path, json.dumps(body).encode()


class ValidTraffic:
    """Valid requests sent to the router in a loop until stopped; every status kept."""

    def __init__(self, router: ManagedProcess) -> None:
        self.statuses: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(router,), daemon=True)

    def _run(self, router: ManagedProcess) -> None:
        while not self._stop.is_set():
            body = {"model": "demo", "prompt": f"still served {len(self.statuses)}",
                    "max_tokens": 2, "stream": len(self.statuses) % 2 == 1}
            self.statuses.append(post(router, "/v1/completions", body)[0])

    def __enter__(self) -> ValidTraffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


def kv_settled(worker: ManagedProcess) -> bool:
    _, text = worker.get_json("/metrics")
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    return (values["kv_blocks_free"] + values["kv_blocks_cached"] == values["kv_blocks_total"]
            and values["num_requests_running"] == values["num_requests_waiting"] == 0
            and values["http_unhandled_exceptions_total"] == 0)


def test_fuzzed_bodies_never_get_a_5xx_and_leak_nothing(cluster) -> None:
    router, workers = cluster
    seen: list[tuple[str, int]] = []

    @settings(max_examples=150, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(requests(), st.booleans())
    def fuzz(request: tuple[str, bytes], direct: bool) -> None:
        path, raw = request
        url = f"{workers[0].url if direct else router.url}{path}"
        status, answer = post_raw(url, raw)
        seen.append(("worker" if direct else "router", status))
        assert status < 500, (raw[:300], answer[:300])
        if status != 200:
            error = json.loads(answer)["error"]
            assert set(error) == {"message", "type", "param", "code"}

    with ValidTraffic(router) as traffic:
        fuzz()
    assert traffic.statuses and set(traffic.statuses) == {200}, traffic.statuses
    assert {status for _, status in seen} >= {200, 400}
    assert {side for side, _ in seen} == {"router", "worker"}
    for worker in workers:
        wait_until(lambda worker=worker: kv_settled(worker), 20, interval_s=0.2)


# ---- router and worker agree --------------------------------------------------------

CHAT_MESSAGES = [{"role": "user", "content": "compare me"}]
FULL = {"ignore_eos": True, "temperature": 0}  # the same tokens, whichever worker runs it
CONTRACT_BODIES = [
    ("/v1/completions", {"prompt": "hello there", "max_tokens": 3, **FULL}),
    ("/v1/completions", {"prompt": [72, 105], "max_tokens": 2, "n": 2, **FULL}),
    ("/v1/completions", {"prompt": "s", "max_tokens": 3, "stream": True,
                         "stream_options": {"include_usage": True}, **FULL}),
    ("/v1/chat/completions", {"messages": CHAT_MESSAGES, "max_completion_tokens": 3, **FULL}),
    ("/v1/chat/completions", {"messages": CHAT_MESSAGES, "max_tokens": 3, "stream": True,
                              "n": 2, "stream_options": {"include_usage": True}, **FULL}),
    ("/v1/completions", {"prompt": "x" * 2030}),  # over the worker's context of 2000
    ("/v1/completions", {"prompt": "x" * 1995, "max_tokens": 8}),  # no room for 8
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 1990}],
                              "max_completion_tokens": 8}),
    ("/v1/completions", {"prompt": "x", "top_k": 9223372036854775808}),
    ("/v1/completions", {"prompt": "x", "top_k": -2}),
    ("/v1/completions", {"prompt": "x", "temperature": 5}),
    ("/v1/completions", {"prompt": "x", "top_p": 0}),
    ("/v1/completions", {"prompt": "x", "n": 17}),
    ("/v1/completions", {"prompt": "x", "seed": -1}),
    ("/v1/completions", {"prompt": "x", "stop": ["s"] * 17}),
    ("/v1/completions", {"prompt": "x", "stop_token_ids": [262]}),
    ("/v1/completions", {"prompt": "x", "logprobs": 2}),
    ("/v1/completions", {"prompt": "x", "presence_penalty": 1}),
    ("/v1/completions", {"prompt": "x", "kv_transfer_params": {"a": 1}}),
    ("/v1/completions", {"prompt": "\ud800"}),
    ("/v1/completions", {"prompt": [1, 262]}),
    ("/v1/completions", {"prompt": ["a", "b"]}),
    ("/v1/completions", {}),
    ("/v1/chat/completions", {"messages": CHAT_MESSAGES, "tools": [{"type": "function"}]}),
    ("/v1/chat/completions", {"messages": CHAT_MESSAGES, "response_format": {"type": "json"}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "name": "eve"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}),  # template
    ("/v1/chat/completions", {"messages": CHAT_MESSAGES, "max_completion_tokens": 0}),
    ("/v1/chat/completions", {"messages": CHAT_MESSAGES, "stream_options": {"x": True}}),
    ("/v1/chat/completions", {"messages": CHAT_MESSAGES, "chat_template": "{{ 1 }}"}),
]


def skeleton(value: Any) -> Any:
    """The shape of a JSON value: keys and types, no values."""
    if isinstance(value, dict):
        return {key: skeleton(item) for key, item in value.items()}
    if isinstance(value, list):
        return [skeleton(item) for item in value]
    return type(value).__name__


def answer_shape(answer: Any) -> Any:
    if isinstance(answer, list):  # a stream: its distinct chunk shapes
        return sorted({json.dumps(skeleton(chunk), sort_keys=True) for chunk in answer})
    return json.dumps(skeleton(answer), sort_keys=True)


@pytest.mark.parametrize(("path", "body"), CONTRACT_BODIES)
def test_router_and_worker_answer_alike(cluster, path: str, body: dict) -> None:
    router, workers = cluster
    body = {"model": "demo", **body}
    via_router = post(router, path, body)
    direct = post(workers[0], path, body)
    assert via_router[0] == direct[0], (via_router, direct)
    if direct[0] == 200:
        assert answer_shape(via_router[1]) == answer_shape(direct[1])
    else:
        assert via_router[1]["error"]["param"] == direct[1]["error"]["param"], (via_router, direct)


# ---- tenants cannot read each other's caches ------------------------------------------

PRIVATE = "Alice's contract: the fee is 4,180 euros, payable on 12 May; penalty 9 percent. " * 3


def public_tokens() -> int:
    system = [{"role": "system", "content": SYSTEM}]
    num_tokens = len(PromptTokenizer.demo().encode_chat(system, add_generation_prompt=False))
    return num_tokens // BLOCK_SIZE * BLOCK_SIZE


def cached_tokens(router: ManagedProcess, model: str, text: str, key: str) -> int:
    body = {"model": model, "max_tokens": 1,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]}
    status, answer = post(router, "/v1/chat/completions", body, key)
    assert status == 200, answer
    return answer["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("model", ["solo", "salted"])
def test_a_tenant_sees_no_more_of_another_tenants_prompt_than_the_public_part(cluster, model):
    router, _ = cluster
    public = public_tokens()
    cached_tokens(router, model, PRIVATE, ALICE)
    assert cached_tokens(router, model, PRIVATE, ALICE) > public + 100, "alice's own cache hits"
    assert cached_tokens(router, model, PRIVATE[:150], BOB) <= public, "about 150 shared tokens"


# ---- sizes and neighbours ------------------------------------------------------------------


def test_a_30_mb_prompt_is_refused_by_its_length_before_tokenizing(cluster) -> None:
    router, workers = cluster
    raw = json.dumps({"model": "demo", "prompt": "z" * 30_000_000}).encode()
    status, answer = post_raw(f"{router.url}/v1/completions", raw)
    error = json.loads(answer)["error"]  # the router: by its body, before reading it
    assert (status, error["code"], error["param"]) == (413, "request_too_large", None)
    assert "bytes for this key" in error["message"]
    raw = json.dumps({"model": "demo", "prompt": "z" * 50_000}).encode()
    status, answer = post_raw(f"{router.url}/v1/completions", raw)
    error = json.loads(answer)["error"]  # within the body bound: by its characters
    assert (status, error["code"], error["param"]) == (413, "prompt_too_long", "prompt")
    assert "characters" in error["message"]
    status, answer = post_raw(f"{workers[0].url}/v1/completions", raw)
    error = json.loads(answer)["error"]
    assert (status, error["code"], error["param"]) == (413, "context_length_exceeded", "prompt")
    assert "characters" in error["message"]


def test_an_out_of_range_request_does_not_disturb_running_streams(cluster) -> None:
    _, workers = cluster
    results: list[tuple[int, Any]] = []
    body = {"model": "demo", "prompt": "stream on", "max_tokens": 24, "ignore_eos": True,
            "stream": True}
    threads = [threading.Thread(target=lambda: results.append(post(workers[1], "/v1/completions",
                                                                   body)))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    bad = post(workers[1], "/v1/completions", {**body, "top_k": 9223372036854775808})
    for thread in threads:
        thread.join(60)
    assert bad[0] == 400 and bad[1]["error"]["param"] == "top_k"
    assert [status for status, _ in results] == [200] * 8
    assert all(chunks[-1]["choices"][0]["finish_reason"] == "length" for _, chunks in results)
