"""End to end: a canary rollout of a KV format, with real workers and a real router.

Three demo workers, one per pool of model ``demo``: ``baseline`` (the model's own KV
dtype), ``fp8`` (``--kv-cache-dtype fp8_e5m2``: two mantissa bits, so greedy decoding
of the default probe prompts leaves the baseline's tokens) and ``same`` (the
baseline's format: the same tokens). While clients send a steady concurrent stream
of requests, the router's first probe drains ``fp8`` to weight 0 and leaves ``same``
its weight; no client request fails.
"""

from __future__ import annotations

import itertools
import re
import threading
from collections.abc import Iterator

import pytest

from harness.procs import ManagedProcess, http_json, start_router, start_worker
from router.up.launcher import stop_all
from tests.support.polling import wait_until
from tests.support.router_calls import admin, openai_complete, wait_until_ready
from tests.support.router_configs import (
    ADMIN,
    ALICE,
    BOB,
    WORKER_KEY,
    WORKER_KEY_ENV,
    keyed_demo_config,
    to_toml,
)

# Its module-scoped processes start once: the whole module runs on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e_canary")]
POOLS = {"baseline": ("w0", ()),
         "fp8": ("w1", ("--kv-cache-dtype", "fp8_e5m2", "--allow-unit-kv-scales")),
         "same": ("w2", ())}
WEIGHTS = {"baseline": 40, "fp8": 30, "same": 30}
# Long enough for the client stream to reach every pool before the first probe.
PROBE_INTERVAL_S = 4.0
NUM_CLIENTS = 4
MAX_TOKENS = 8


def canary_config(urls: dict[str, str]) -> str:
    """``keyed_demo_config`` with the three pools and fast guards."""
    config = keyed_demo_config(urls)
    config["models"]["demo"]["canary"] = {"probe_interval_s": PROBE_INTERVAL_S,
                                          "check_interval_s": 0.2, "probe_max_tokens": 16,
                                          "probe_timeout_s": 20}
    config["models"]["demo"]["pools"] = {pool: {"workers": [worker_id], "weight": WEIGHTS[pool]}
                                         for pool, (worker_id, _) in POOLS.items()}
    return to_toml(config)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[ManagedProcess, dict[str, ManagedProcess]]]:
    workers = {worker_id: start_worker(*flags, kv_cache_bytes="16MiB", wait=False,
                                       api_key=WORKER_KEY)
               for worker_id, flags in POOLS.values()}
    router = None
    try:
        for worker in workers.values():
            worker.wait_ready(120)
        path = tmp_path_factory.mktemp("router") / "router.toml"
        path.write_text(canary_config({name: w.url for name, w in workers.items()}))
        router = start_router(path, "--metrics-port", "0", env={WORKER_KEY_ENV: WORKER_KEY})
        wait_until_ready(router)
        yield router, workers
    finally:
        stop_all([*filter(None, [router]), *workers.values()])  # together: each takes seconds


class ClientStream:
    """``NUM_CLIENTS`` threads sending requests of ever new conversations (two
    tenants) until ``stop``; every failure is kept."""

    def __init__(self, router: ManagedProcess) -> None:
        self._router = router
        self._numbers = itertools.count()
        self._stopped = threading.Event()
        self.num_done = 0
        self.failures: list[str] = []
        self._threads = [threading.Thread(target=self._run, args=(key,))
                         for key in [ALICE, BOB] * (NUM_CLIENTS // 2)]
        for thread in self._threads:
            thread.start()

    def _run(self, key: str) -> None:
        while not self._stopped.is_set():
            i = next(self._numbers)
            try:
                answer = openai_complete(self._router,
                                         f"{i}: what is item {i}? A new conversation.", key,
                                         max_tokens=MAX_TOKENS)
                assert answer.usage.completion_tokens == MAX_TOKENS, answer
                self.num_done += 1
            except Exception as exc:  # every failure is the test's finding
                self.failures.append(f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        self._stopped.set()
        for thread in self._threads:
            thread.join(60)


def served(router: ManagedProcess) -> dict[str, int]:
    return {w: s["num_requests"] for w, s in admin(router, "/admin/index")["workers"].items()}


def pools(router: ManagedProcess) -> dict[str, dict]:
    return admin(router, "/admin/canary")["models"]["demo"]["pools"]


def metric(router: ManagedProcess, name: str, **labels: str) -> float:
    _, text = http_json("GET", f"{router.metrics_url}/metrics")
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    match = re.search(rf"^{name}\{{{wanted}\}} (\S+)$", str(text), re.MULTILINE)
    assert match, f"no {name}{{{wanted}}} in the metrics"
    return float(match.group(1))


def test_a_diverging_pool_is_drained_and_an_agreeing_one_kept(cluster) -> None:
    router, _ = cluster
    stream = ClientStream(router)
    try:
        tripped = wait_until(lambda: pools(router)["fp8"]["tripped"], timeout_s=30,
                             what=lambda: pools(router))
        wait_until(lambda: pools(router)["same"]["last_probe"], what=lambda: pools(router))
        served_at_trip, done_at_trip = served(router), stream.num_done
        wait_until(lambda: stream.num_done >= done_at_trip + 2 * NUM_CLIENTS)
    finally:
        stream.stop()
    assert not stream.failures, stream.failures[:3]
    assert tripped["reason"] == "probe" and "differ from the baseline" in tripped["detail"]
    state = pools(router)
    assert {p: s["weight"] for p, s in state.items()} == {**WEIGHTS, "fp8": 0}
    assert state["same"]["tripped"] is None and state["same"]["last_probe"] == "agree"
    assert all(served_at_trip[w] > 0 for w, _ in POOLS.values()), served_at_trip
    # New conversations go by the remaining weights: none to the drained pool.
    before = served(router)
    for i in range(12):
        openai_complete(router, f"{i}: after the fallback, a new conversation", max_tokens=2)
    after = served(router)
    assert after["w1"] == before["w1"] and sum(after.values()) == sum(before.values()) + 12
    assert after["w2"] > before["w2"]
    labels = {"model": "demo", "pool": "fp8"}
    assert metric(router, "router_pool_weight", **labels) == 0
    assert metric(router, "router_canary_fallbacks_total", **labels, reason="probe") == 1
    assert metric(router, "router_canary_fallbacks_total", **labels, reason="error_rate") == 0
    assert metric(router, "router_canary_probes_total", model="demo", pool="same",
                  result="agree") >= 1


def test_admin_sets_weights_and_re_enables_a_tripped_pool(cluster) -> None:
    router, _ = cluster
    wait_until(lambda: pools(router)["fp8"]["tripped"], timeout_s=30)
    assert admin(router, "/admin/canary", {"model": "demo", "weights": {"fp8": 5}}) == {
        "model": "demo", "weights": {"baseline": 40.0, "fp8": 5.0, "same": 30.0}}
    state = pools(router)["fp8"]
    assert state["weight"] == 5 and state["tripped"] is None
    assert state["window"]["num_requests"] == 0
    assert metric(router, "router_pool_weight", model="demo", pool="fp8") == 5
    admin(router, "/admin/canary", {"model": "demo", "weights": {"fp8": 0}})
    url, auth = f"{router.url}/admin/canary", {"Authorization": f"Bearer {ADMIN}"}
    for body, status, param in [
        ({"model": "demo", "weights": {"nope": 1}}, 400, "weights"),
        ({"model": "demo", "weights": {"fp8": -1}}, 400, "weights"),
        ({"model": "demo", "weights": {"baseline": 0, "fp8": 0, "same": 0}}, 400, "weights"),
        ({"model": "other", "weights": {"fp8": 1}}, 404, "model"),
        ({"model": "demo", "weights": []}, 400, "weights"),
    ]:
        code, answer = http_json("POST", url, body, auth)
        assert (code, answer["error"]["param"]) == (status, param), answer
    assert http_json("GET", url, None, {"Authorization": f"Bearer {ALICE}"})[0] in (401, 403)

