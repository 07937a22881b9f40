"""Every metric the alert rules and the dashboard name is exported by a live router
or a live worker (real processes on loopback, after a few requests so that every
labelled metric has children)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.procs import ManagedProcess, http_json, start_router, start_worker, wait_routable
from tests.support.promql import metric_names, used_metric_names
from tests.support.router_calls import complete
from tests.support.router_configs import auth_section, model_table, to_toml, worker_list

# Exported by a feature still on its way; remove a name once a live process exports it.
NOT_YET_EXPORTED = frozenset({
    "router_shared_state_up",  # the Redis shared state (another branch)
})
# Exported only by a router that discovers its workers (tests/router/test_e2e_discovery.py
# reads them from a live one).
ONLY_WITH_DISCOVERY = frozenset({"router_discovery_up", "router_discovery_refused_pods_total"})
# Exported only by a router that follows a vLLM worker's events (the follower's own
# counters: tests/router/fleet/events/vllm/test_vllm_follower.py reads them).
ONLY_WITH_VLLM = frozenset({"router_kv_event_malformed_total"})


def exported(text: str) -> set[str]:
    """The sample names of a Prometheus text exposition (``_bucket``, ``_total``...)."""
    return {sample.name for family in text_string_to_metric_families(text)
            for sample in family.samples}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[ManagedProcess, ManagedProcess]]:
    # A producer and a consumer of KV transfers (docs/pd.md): its transfer metrics exist.
    worker = start_worker("--kv-transfer-config", '{"kv_role": "kv_both"}',
                          kv_cache_bytes="8MiB")
    router = None
    try:
        path = tmp_path_factory.mktemp("router") / "router.toml"
        pools = {"baseline": {"workers": ["w0"], "weight": 1},
                 "candidate": {"workers": ["w1"], "weight": 0}}
        path.write_text(to_toml({
            "models": {"demo": model_table(pools=pools)},
            "auth": auth_section({"alice": {}}, admin=False),
            # The same worker again as a canary pool: its metrics exist from the start.
            "workers": worker_list({"w0": worker.url, "w1": worker.url}),
            "flow": {"enabled": True},  # its requests pass the queue step; its metrics exist
        }))
        router = start_router(path, "--metrics-port", "0")
        wait_routable(router, 2, 60.0)
        yield router, worker
    finally:
        if router is not None:
            router.stop()
        worker.stop()


@pytest.mark.slow
def test_every_metric_the_rules_and_dashboard_use_is_exported(cluster) -> None:
    router, worker = cluster
    prompt = "The operations kit watches the cache. " * 4
    for _ in range(2):  # the second request hits the worker's prefix cache
        status, answer = complete(router, prompt, max_tokens=4, full_length=False)
        assert status == 200, answer
    _, worker_text = worker.get_json("/metrics")
    _, router_text = http_json("GET", f"{router.metrics_url}/metrics")
    names = exported(str(worker_text)) | exported(str(router_text))
    missing = (used_metric_names() - names - NOT_YET_EXPORTED - ONLY_WITH_DISCOVERY
               - ONLY_WITH_VLLM)
    assert not missing, f"named in alerts.yml or the dashboard but not exported: {sorted(missing)}"
    assert used_metric_names() >= NOT_YET_EXPORTED, "NOT_YET_EXPORTED lists an unused name"


def test_metric_names_skip_functions_labels_strings_and_ranges() -> None:
    expr = ('histogram_quantile(0.99, sum by (job, le) (rate(a_seconds_bucket{code=~"5..",'
            ' x="rate(b)"}[$__rate_interval]))) > on (job) group_left (tenant) b_total offset 1h'
            ' and bool c:recorded / ignoring(x) d unless max without (y) (e) * 1e3 > Inf')
    assert metric_names(expr) == {"a_seconds_bucket", "b_total", "c:recorded", "d", "e"}

