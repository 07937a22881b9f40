"""End to end: a router process in front of two demo worker processes of one model, the
second started with another engine numerics version (``--engine-numerics-version``).
Their namespaces differ only in that field; the router keeps their caches apart (one
index tree each, no shared block) and reports the split pool: ``GET /admin/workers``
groups the model's workers by namespace, ``router_model_namespaces{model}`` reads 2,
and the router logs the split, naming the field that differs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from harness.procs import ManagedProcess, start_router, started_workers
from tests.support.metric_samples import router_metric
from tests.support.polling import wait_until
from tests.support.router_calls import admin, wait_until_ready
from tests.support.router_configs import WORKER_KEY, WORKER_KEY_ENV, keyed_demo_config, to_toml
from workers.model.numerics import ENGINE_NUMERICS_VERSION

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e_namespaces")]
NEWER = ENGINE_NUMERICS_VERSION + 1
BLOCK_SIZE = 16
PROMPT = "".join(f"Clause {i}: the tenant shall keep the premises tidy. " for i in range(3))
SPLIT_LOG = "its ready workers are in 2 cache namespaces"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[ManagedProcess, dict[str, ManagedProcess]]]:
    flags = {"w0": ((), WORKER_KEY),
             "w1": (("--engine-numerics-version", str(NEWER)), WORKER_KEY)}
    with started_workers(flags, kv_cache_bytes="16MiB") as workers:
        path = tmp_path_factory.mktemp("router") / "router.toml"
        path.write_text(to_toml(keyed_demo_config({n: w.url for n, w in workers.items()})))
        router = start_router(path, env={WORKER_KEY_ENV: WORKER_KEY})
        try:
            wait_until_ready(router)
            yield router, workers
        finally:
            router.stop()


def ready(worker: ManagedProcess) -> dict[str, Any]:
    status, body = worker.get_json("/ready")
    assert status == 200, body
    return body


def test_the_newer_numerics_worker_is_its_own_namespace_and_the_split_is_reported(cluster):
    router, workers = cluster
    mine, newer = ready(workers["w0"]), ready(workers["w1"])
    assert mine["namespace"]["engine_numerics_version"] == ENGINE_NUMERICS_VERSION
    assert newer["namespace"] == {**mine["namespace"], "engine_numerics_version": NEWER}
    assert mine["namespace_digest"] != newer["namespace_digest"]
    wait_until(lambda: router_metric(router, "router_model_namespaces", {"model": "demo"}) == 2,
               30, lambda: "router_model_namespaces{model=demo} 2")
    listed = admin(router, "/admin/workers")
    namespaces = {w["id"]: w["namespace"] for w in listed["workers"]}
    assert namespaces["w0"] != namespaces["w1"]
    demo = listed["models"]["demo"]
    assert demo["num_namespaces"] == 2
    assert {namespace: group["workers"] for namespace, group in demo["namespaces"].items()} == {
        namespaces["w0"]: ["w0"], namespaces["w1"]: ["w1"]}
    assert demo["namespaces"][namespaces["w1"]]["fields"] == newer["namespace"]
    # Once per change of the set (exactly once unless a probe missed under load).
    assert SPLIT_LOG in router.log_text() and "engine_numerics_version" in router.log_text()


def test_one_prompt_cached_on_both_shares_no_index_entry(cluster):
    router, workers = cluster
    num_blocks = (len(PROMPT) + 1) // BLOCK_SIZE  # BOS + one token per byte
    for worker in workers.values():
        status, body = worker.post_json("/v1/completions", {
            "model": "demo", "prompt": PROMPT, "max_tokens": 1})
        assert status == 200, body

    def held() -> dict[str, int]:
        return {w: s["num_blocks"] for w, s in admin(router, "/admin/index")["workers"].items()}

    wait_until(lambda: min(held().values()) >= num_blocks, 30,
               lambda: f"both workers' blocks indexed: {held()}")
    index = admin(router, "/admin/index")["index"]
    # One namespace would file the prompt's blocks once, held by both: fewer nodes.
    assert index["num_trees"] == 2
    assert index["num_nodes"] == sum(held().values())
