"""Two router processes, one real ``redis-server``, demo worker processes.

A worker added through router A's admin API is used by router B and removed
everywhere through B; a tenant limited to N concurrent requests gets 429 on the
N+1th whichever router it hits; both routers' indexes converge to the same blocks;
and a Redis outage in the middle of a workload fails no request, shows
``router_shared_state_up 0``, falls back to a local share of the limit, and once Redis
is back the gauge is 1 and the limit is shared again. The outage test stops Redis,
so it runs last.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator

import pytest

from harness.procs import ManagedProcess, http_json, start_router, start_worker
from router.up.launcher import RedisServer
from tests.support.polling import wait_until
from tests.support.router_calls import admin, complete
from tests.support.router_configs import (
    ALICE,
    BOB,
    FAST_REGISTRY,
    auth_section,
    model_table,
    to_toml,
    worker_list,
)

# Its module-scoped processes start once: the whole module runs on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e_multi_router")]
ALICE_CONCURRENT = 2
LONG_TOKENS = 1500  # several seconds of decoding on a demo worker: a slot held open


def config_text(redis_url: str, workers: dict[str, str]) -> str:
    return to_toml({
        "models": {"demo": model_table()},
        "registry": FAST_REGISTRY,
        # A call slower than command_timeout_s falls back to a local share; on a busy
        # test machine a short timeout would mix modes and blur the exact-limit checks.
        "redis": {"url": redis_url, "key_prefix": "e2e", "heartbeat_interval_s": 0.2,
                  "lease_ttl_s": 3.0, "sync_interval_s": 0.2, "command_timeout_s": 1.0},
        "auth": auth_section({"alice": {"max_concurrent_requests": ALICE_CONCURRENT},
                              "bob": {}}),
        "workers": worker_list(workers),
    })


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[RedisServer, list[ManagedProcess], list[ManagedProcess]]]:
    """Redis, three workers (w0 and w1 configured, w2 spare) and routers A and B."""
    redis = RedisServer()
    workers = [start_worker(kv_cache_bytes="16MiB", wait=False) for _ in range(3)]
    routers: list[ManagedProcess] = []
    try:
        for worker in workers:
            worker.wait_ready(120)
        path = tmp_path_factory.mktemp("multi") / "router.toml"
        path.write_text(config_text(redis.url, {"w0": workers[0].url, "w1": workers[1].url}))
        routers = [start_router(path), start_router(path)]
        for router in routers:
            wait_until(lambda r=router: ready_workers(r) == {"w0", "w1"}, 60)
        yield redis, workers, routers
    finally:
        for process in [*routers, *workers]:
            process.stop()
        redis.stop()


def ready_workers(router: ManagedProcess) -> set[str]:
    return {w["id"] for w in admin(router, "/admin/workers")["workers"] if w["ready"]}


def shared_state_up(router: ManagedProcess) -> float:
    status, text = http_json("GET", f"{router.metrics_url}/metrics")
    assert status == 200
    line = next(x for x in text.splitlines() if x.startswith("router_shared_state_up "))
    return float(line.split()[1])


class HeldStream:
    """A streaming alice request, open until ``close``: it holds one of her slots."""

    def __init__(self, router: ManagedProcess) -> None:
        url = urllib.parse.urlsplit(router.url)
        self.conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        body = {"model": "demo", "prompt": "hold", "max_tokens": LONG_TOKENS, "stream": True,
                "ignore_eos": True}
        self.conn.request("POST", "/v1/completions", json.dumps(body),
                          {"Authorization": f"Bearer {ALICE}", "Content-Type": "application/json"})
        self.response = self.conn.getresponse()
        self.status = self.response.status
        if self.status == 200:
            self.response.readline()  # the first byte: admitted and streaming

    def close(self) -> None:
        self.conn.close()  # the router cancels the request and frees the slot


def check_limit_shared(routers: list[ManagedProcess]) -> None:
    """N streams held through A and B; the N+1th is 429 on both routers."""
    held = [HeldStream(routers[i % 2]) for i in range(ALICE_CONCURRENT)]
    try:
        assert [h.status for h in held] == [200] * ALICE_CONCURRENT
        for router in routers:
            status, body = complete(router, "one more", ALICE)
            logs = "\n".join(r.log_text()[-1500:] for r in routers)  # fallbacks are logged
            assert status == 429 and body["error"]["code"] == "concurrency_limit", (body, logs)
    finally:
        for stream in held:
            stream.close()
    wait_until(lambda: complete(routers[1], "after", ALICE)[0] == 200, 10)


def test_worker_added_through_a_is_used_by_b(cluster) -> None:
    _, workers, (a, b) = cluster
    admin(a, "/admin/workers", {"action": "add",
                                "worker": {"id": "w2", "model": "demo", "url": workers[2].url}})
    started = time.monotonic()
    wait_until(lambda: "w2" in ready_workers(b), 5)
    assert time.monotonic() - started < 2.5  # one sync period plus one probe, with margin
    prompts = [f"{i:02d} distinct question number {i} " * 4 for i in range(12)]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        assert {s for s, _ in pool.map(lambda p: complete(b, p, BOB), prompts)} == {200}
    assert admin(b, "/admin/index")["workers"]["w2"]["num_requests"] > 0
    admin(b, "/admin/workers", {"action": "remove", "id": "w2"})
    wait_until(lambda: "w2" not in {w["id"] for w in admin(a, "/admin/workers")["workers"]}, 5)


def test_concurrency_limit_is_shared_by_both_routers(cluster) -> None:
    check_limit_shared(cluster[2])


def test_both_indexes_converge(cluster) -> None:
    _, _, (a, b) = cluster
    document = "".join(f"Clause {i}: the tenant keeps the premises tidy. " for i in range(8))
    for i in range(6):
        assert complete((a, b)[i % 2], document + f"Question {i}?", BOB)[0] == 200

    def same() -> bool:
        index_a, index_b = admin(a, "/admin/index"), admin(b, "/admin/index")
        blocks = {w: s["num_blocks"] for w, s in index_a["workers"].items()}
        return index_a["fingerprint"] == index_b["fingerprint"] and sum(blocks.values()) > 0

    wait_until(same, 5)


def test_redis_outage_fails_no_request_and_resyncs(cluster) -> None:
    redis, _, routers = cluster
    assert [shared_state_up(r) for r in routers] == [1.0, 1.0]
    results: list[int] = []
    stop = threading.Event()

    def load(router: ManagedProcess, worker: int) -> None:
        i = 0
        while not stop.is_set():
            results.append(complete(router, f"load {worker} request {i} " * 3, BOB)[0])
            i += 1

    threads = [threading.Thread(target=load, args=(routers[i % 2], i)) for i in range(4)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(0.5)
        redis.stop()
        wait_until(lambda: [shared_state_up(r) for r in routers] == [0.0, 0.0], 5)
        # Down: each of the 2 routers last seen alive may hold 2 // 2 = 1 of alice's slots.
        held = HeldStream(routers[0])
        try:
            assert held.status == 200 and complete(routers[0], "over", ALICE)[0] == 429
            assert complete(routers[1], "within", ALICE)[0] == 200
        finally:
            held.close()
        time.sleep(0.5)
        redis.start()
        wait_until(lambda: [shared_state_up(r) for r in routers] == [1.0, 1.0], 5)
        time.sleep(0.5)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert len(results) > 20 and set(results) == {200}, results
    check_limit_shared(routers)
