"""Every metric the alert rules and the dashboard name is exported by a live router
or a live worker (real processes on loopback, after a few requests so that every
labelled metric has children)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.promql import metric_names, used_metric_names

from harness.procs import ManagedProcess, http_json, start_router, start_worker
from router.front.auth import hash_key

ALICE = "key-alice"
# Exported by a feature still on its way; remove a name once a live process exports it.
NOT_YET_EXPORTED = frozenset({
    "router_shared_state_up",  # the Redis shared state (another branch)
})


def exported(text: str) -> set[str]:
    """The sample names of a Prometheus text exposition (``_bucket``, ``_total``...)."""
    return {sample.name for family in text_string_to_metric_families(text)
            for sample in family.samples}


def wait_for_ready_workers(router: ManagedProcess, count: int, timeout_s: float = 60.0) -> None:
    """Block until the router's ``/health`` counts ``count`` ready workers."""
    deadline = time.monotonic() + timeout_s
    while True:
        _, health = router.get_json("/health")
        if isinstance(health, dict) and health.get("num_ready_workers") == count:
            return
        assert time.monotonic() < deadline, f"workers not ready in {timeout_s} s: {health}"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[ManagedProcess, ManagedProcess]]:
    worker = start_worker(kv_cache_bytes="8MiB")
    router = None
    try:
        path = tmp_path_factory.mktemp("router") / "router.toml"
        path.write_text("\n".join([
            "[models.demo]", 'tokenizer = "demo"',
            "[auth.tenants.alice]", f'key_digests = ["{hash_key(ALICE)}"]',
            "[[workers]]", 'id = "w0"', 'model = "demo"', f'url = "{worker.url}"',
            # The same worker again as a canary pool: its metrics exist from the start.
            "[[workers]]", 'id = "w1"', 'model = "demo"', f'url = "{worker.url}"',
            "[models.demo.pools.baseline]", 'workers = ["w0"]', "weight = 1",
            "[models.demo.pools.candidate]", 'workers = ["w1"]', "weight = 0",
        ]) + "\n")
        router = start_router(path, "--metrics-port", "0")
        wait_for_ready_workers(router, 2)
        yield router, worker
    finally:
        if router is not None:
            router.stop()
        worker.stop()


@pytest.mark.slow
def test_every_metric_the_rules_and_dashboard_use_is_exported(cluster) -> None:
    router, worker = cluster
    body = {"model": "demo", "prompt": "The operations kit watches the cache. " * 4,
            "max_tokens": 4}
    for _ in range(2):  # the second request hits the worker's prefix cache
        status, answer = http_json("POST", f"{router.url}/v1/completions", body,
                                   {"Authorization": f"Bearer {ALICE}"})
        assert status == 200, answer
    _, worker_text = worker.get_json("/metrics")
    _, router_text = http_json("GET", f"{router.metrics_url}/metrics")
    names = exported(str(worker_text)) | exported(str(router_text))
    missing = used_metric_names() - names - NOT_YET_EXPORTED
    assert not missing, f"named in alerts.yml or the dashboard but not exported: {sorted(missing)}"
    assert used_metric_names() >= NOT_YET_EXPORTED, "NOT_YET_EXPORTED lists an unused name"


def test_metric_names_skip_functions_labels_strings_and_ranges() -> None:
    expr = ('histogram_quantile(0.99, sum by (job, le) (rate(a_seconds_bucket{code=~"5..",'
            ' x="rate(b)"}[$__rate_interval]))) > on (job) group_left (tenant) b_total offset 1h'
            ' and bool c:recorded / ignoring(x) d unless max without (y) (e) * 1e3 > Inf')
    assert metric_names(expr) == {"a_seconds_bucket", "b_total", "c:recorded", "d", "e"}

