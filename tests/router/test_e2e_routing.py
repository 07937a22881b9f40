"""End to end: the openai client -> a router process -> two demo worker processes.

One router and two workers serve the whole module (tiny KV budgets, short outputs);
the failover test kills a worker, so it runs last. The workers require a key, which
the router reads from the environment variable its config names.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from harness.procs import ManagedProcess, http_json, start_router, start_worker, stream_lines
from radix.events import KVEvent, decode_event
from router.routing.index import RouterIndex
from tests.support.metric_samples import sample
from tests.support.polling import wait_until
from tests.support.router_calls import (
    FULL_LENGTH,
    admin,
    openai_client,
    openai_complete,
    wait_until_ready,
)
from tests.support.router_configs import (
    ALICE,
    BOB,
    SYSTEM,
    WORKER_KEY,
    WORKER_KEY_ENV,
    keyed_demo_config,
    to_toml,
)

# Its module-scoped processes start once: the whole module runs on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e_routing")]
ADDED_KEY_ENV = "RADIX_WORKER_KEY_W2"  # an admin-added worker w2 reads only its own variable
BLOCK_SIZE = 16


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[ManagedProcess, dict[str, ManagedProcess]]]:
    workers = {name: start_worker(kv_cache_bytes="16MiB", wait=False, api_key=WORKER_KEY)
               for name in ("w0", "w1")}
    router = None
    try:  # a router that fails to start must not leave the workers running
        for worker in workers.values():
            worker.wait_ready(120)
        path = tmp_path_factory.mktemp("router") / "router.toml"
        path.write_text(to_toml(keyed_demo_config({name: w.url for name, w in workers.items()})))
        router = start_keyed_router(path)
        wait_until_ready(router)
        yield router, workers
    finally:
        if router is not None:
            router.stop()
        for worker in workers.values():
            worker.stop()


def start_keyed_router(path: Path, *flags: str) -> ManagedProcess:
    return start_router(path, *flags, env={WORKER_KEY_ENV: WORKER_KEY, ADDED_KEY_ENV: WORKER_KEY})


@pytest.fixture(scope="module")
def openai_router(cluster, tmp_path_factory: pytest.TempPathFactory
                  ) -> Iterator[ManagedProcess]:
    """A second router in front of w0 as an ``openai`` worker "oa": it routes there
    approximately (what it routed), never reading w0's KV events."""
    _, workers = cluster
    path = tmp_path_factory.mktemp("openai") / "openai.toml"
    path.write_text(to_toml(keyed_demo_config({"oa": workers["w0"].url}, kind="openai")))
    router = start_keyed_router(path)
    try:
        wait_until_ready(router)
        yield router
    finally:
        router.stop()


def requests_per_worker(router: ManagedProcess) -> dict[str, int]:
    return {w: s["num_requests"] for w, s in admin(router, "/admin/index")["workers"].items()}


def cached(response: Any) -> int:
    return response.usage.prompt_tokens_details.cached_tokens


def test_openai_client_streaming_and_not(cluster) -> None:
    router, _ = cluster
    openai = openai_client(router)
    text = openai.completions.create(model="demo", prompt="Hello there", max_tokens=4,
                                     extra_body=FULL_LENGTH)
    assert text.object == "text_completion" and text.usage.completion_tokens == 4
    assert text.usage.prompt_tokens == 12 and text.choices[0].finish_reason == "length"
    chat = openai.chat.completions.create(
        model="demo", max_tokens=3, messages=[{"role": "user", "content": "Hi"}],
        extra_body=FULL_LENGTH)
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens == 3
    stream = openai.chat.completions.create(
        model="demo", max_tokens=3, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "Hi"}], extra_body=FULL_LENGTH)
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 3
    assert [c.choices[0].finish_reason for c in chunks[:-1]][-1] == "length"
    streamed = list(openai.completions.create(model="demo", prompt="Hello", max_tokens=3,
                                              stream=True, extra_body=FULL_LENGTH))
    # One chunk per step with text (held-back partial characters send none) or a finish.
    assert 1 <= len(streamed) <= 3 and streamed[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].text or c.choices[0].finish_reason for c in streamed)


def test_shared_prefix_lands_on_one_worker_and_is_cached(cluster) -> None:
    router, _ = cluster
    document = "".join(f"Clause {i}: the tenant shall keep the premises tidy. " for i in range(12))
    before = requests_per_worker(router)
    responses = [openai_complete(router, document + f"Question {i}?") for i in range(4)]
    after = requests_per_worker(router)
    moved = {w: after[w] - before[w] for w in after if after[w] != before[w]}
    assert list(moved.values()) == [4], moved
    prefix_len = len(document) + 1  # BOS + one token per byte
    for response in responses[1:]:
        assert cached(response) >= prefix_len // BLOCK_SIZE * BLOCK_SIZE


def test_distinct_prefixes_spread_over_both_workers(cluster) -> None:
    router, _ = cluster
    before = requests_per_worker(router)
    prompts = [f"{i:03d} " + f"distinct topic number {i} " * 8 for i in range(24)]
    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        list(pool.map(lambda p: openai_complete(router, p, max_tokens=8), prompts))
    after = requests_per_worker(router)
    counts = sorted(after[w] - before[w] for w in after)
    assert sum(counts) == 24 and counts[0] > 0
    assert counts[1] <= 1.5 * counts[0], counts


def test_tenants_share_public_prefixes_only(cluster) -> None:
    router, _ = cluster
    private = "Alice's private notes: the launch code is 0000. " * 6
    openai_complete(router, private, ALICE)
    assert (cached(openai_complete(router, private, ALICE))
            >= len(private) // BLOCK_SIZE * BLOCK_SIZE)
    assert cached(openai_complete(router, private, BOB)) == 0

    def ask(key: str, question: str) -> Any:
        return openai_client(router, key).chat.completions.create(
            model="demo", max_tokens=2, extra_body=FULL_LENGTH, messages=[
                {"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])

    # BOS, <|system|>, one token per byte, <|end|>: whole blocks of it are public.
    num_public = (3 + len(SYSTEM)) // BLOCK_SIZE * BLOCK_SIZE
    ask(ALICE, "What does clause 1 say?")
    assert cached(ask(BOB, "Which clause is longest?")) == num_public


def worker_snapshot(worker: ManagedProcess) -> list[KVEvent]:
    """The worker's own prefix cache as a ``/kv/events`` snapshot (cleared + stored)."""
    lines = stream_lines(f"{worker.url}/kv/events", quiet_s=0.3, headers=worker.auth)
    events = [decode_event(line) for line in lines if line]
    assert events[0].type == "cleared"
    return [e for e in events if e.seq == events[0].seq]


def worker_snapshot_blocks(worker: ManagedProcess) -> int:
    return sum(len(e.blocks) for e in worker_snapshot(worker) if e.type == "stored")


def test_index_equals_the_union_of_worker_caches(cluster) -> None:
    """The router's index, built from live events, holds the blocks (per namespace) that
    the workers' own caches hold now, but for the partial blocks a split of a worker's
    tree left at the split point: a worker never announces those (docs/protocol.md),
    while its snapshot lists them."""
    router, workers = cluster

    def compare() -> tuple[dict[str, int], dict[str, int]]:
        namespaces = {w["id"]: w["namespace"] for w in admin(router, "/admin/workers")["workers"]}
        union = RouterIndex()
        for name, worker in workers.items():
            for event in worker_snapshot(worker):
                union.apply_event(name, msgspec.structs.replace(event, namespace=namespaces[name]))
        keys = ("num_trees", "num_nodes", "num_tokens")
        routed = admin(router, "/admin/index")["index"]
        return {k: routed[k] for k in keys}, {k: getattr(union.stats(), k) for k in keys}

    def only_split_partials_missing() -> bool:
        routed, union = compare()
        num_missing = union["num_nodes"] - routed["num_nodes"]
        return (routed["num_trees"] == union["num_trees"] and num_missing >= 0
                and 0 <= union["num_tokens"] - routed["num_tokens"] <= (BLOCK_SIZE - 1) * num_missing)

    wait_until(only_split_partials_missing, 10, compare)
    assert compare()[0]["num_tokens"] > 2000


def test_openai_kind_worker_is_routed_approximately(openai_router: ManagedProcess) -> None:
    router = openai_router
    prompt = "An OpenAI-compatible server sees only this text. " * 4
    first = openai_complete(router, prompt)
    assert first.model == "demo" and first.usage.completion_tokens == 2
    assert cached(openai_complete(router, prompt)) >= len(prompt) // BLOCK_SIZE * BLOCK_SIZE
    stream = list(openai_client(router).completions.create(
        model="demo", prompt=prompt, max_tokens=3, stream=True, extra_body=FULL_LENGTH))
    assert stream[-1].choices[0].finish_reason == "length"
    assert all(chunk.choices for chunk in stream)  # no usage chunk nobody asked for
    index = admin(router, "/admin/index")
    assert index["index"]["num_approx_tokens"]["oa"] >= len(prompt)
    assert index["index"]["num_blocks"] == {}


def predictions(router: ManagedProcess) -> dict[str, float]:
    """Worker oa's checked predictions so far, by outcome, from the router's /metrics."""
    namespace = admin(router, "/admin/workers")["workers"][0]["namespace"]
    text = http_json("GET", f"{router.metrics_url}/metrics")[1]
    return {outcome: sample(text, "router_cache_predictions_total",
                            {"worker": "oa", "namespace": namespace, "outcome": outcome})
            for outcome in ("exact", "over", "under")}


def test_a_cache_flushed_behind_the_routers_back_is_counted_over(
        cluster, openai_router: ManagedProcess) -> None:
    """w0 drops its cache (``POST /reset_prefix_cache``); the router that routes it
    approximately cannot know, predicts the prompt it routed there, and counts the
    miss as ``over``."""
    _, workers = cluster
    router = openai_router
    prompt = "Flushed behind the router's back, this document was cached once. " * 3
    assert cached(openai_complete(router, prompt)) < BLOCK_SIZE
    before = predictions(router)
    assert cached(openai_complete(router, prompt)) >= len(prompt) // BLOCK_SIZE * BLOCK_SIZE
    assert predictions(router) == {**before, "exact": before["exact"] + 1}
    status, reset = workers["w0"].post_json("/reset_prefix_cache", {})
    assert status == 200 and reset["num_freed_blocks"] >= len(prompt) // BLOCK_SIZE
    assert cached(openai_complete(router, prompt)) == 0
    assert predictions(router) == {**before, "exact": before["exact"] + 1,
                                   "over": before["over"] + 1}
    stats = admin(router, "/admin/workers")["workers"][0]["stats"]
    assert stats["num_over_predictions"] == before["over"] + 1
    assert stats["exact_fraction"] < 1


def test_worker_restart_drops_its_old_entries(cluster) -> None:
    router, _ = cluster
    worker = start_worker(kv_cache_bytes="4MiB", api_key=WORKER_KEY)
    port = worker.url.rsplit(":", 1)[1]
    try:
        admin(router, "/admin/workers", {"action": "add", "worker": {
            "id": "w2", "url": worker.url, "model": "demo", "api_key_env": ADDED_KEY_ENV}})
        baseline = worker_snapshot_blocks(worker)
        body = {"token_ids": list(range(1, 200)), "scope": "alice",
                "sampling": {"max_tokens": 1}}
        assert worker.post_json("/generate", body)[0] == 200
        wait_until(lambda: admin(router, "/admin/index")["index"]["num_blocks"].get("w2", 0)
                   >= baseline + 12)
        old_epoch = admin(router, "/admin/workers")["workers"][-1]["epoch"]
        worker.stop()
        worker = start_worker("--port", port, kv_cache_bytes="4MiB", api_key=WORKER_KEY)
        fresh = worker_snapshot_blocks(worker)
        wait_until(lambda: admin(router, "/admin/workers")["workers"][-1]["epoch"] != old_epoch)
        wait_until(lambda: admin(router, "/admin/index")["index"]["num_blocks"].get("w2", 0)
                   == fresh)
    finally:
        admin(router, "/admin/workers", {"action": "remove", "id": "w2"})
        worker.stop()


def test_failover_when_a_worker_dies(cluster) -> None:
    router, workers = cluster
    prompts = [f"{i:03d} failover prompt {i} " * 6 for i in range(12)]
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        pending = [pool.submit(openai_complete, router, p, ALICE, 16) for p in prompts]
        time.sleep(0.05)
        workers["w1"].proc.kill()
        for future in pending:
            assert future.result().usage.completion_tokens == 16
    for prompt in prompts[:4]:
        assert openai_complete(router, prompt).usage.completion_tokens == 2
    states = {w["id"]: w["ready"] for w in admin(router, "/admin/workers")["workers"]}
    assert states == {"w0": True, "w1": False}
    assert "w1" not in admin(router, "/admin/index")["index"]["num_blocks"]
