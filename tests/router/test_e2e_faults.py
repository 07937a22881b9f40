"""End to end under faults: a router process and demo worker processes on loopback.

A worker SIGKILLed in the middle of streams: every stream resumes on another worker
and equals, token for token, the same request on an undisturbed worker (greedy, and
seeded sampling). A rolling restart by SIGTERM under steady load: no request fails
and a drained worker's index entries are gone. A bounded chaos run through two
routers on one Redis: random worker SIGKILLs and restarts and one Redis restart under
load; every answer is correct or a retryable refusal before its
first byte, and the surviving workers' blocks are all free or cached afterwards.

Workers restart on the port the system gave them first, so the router (which knows
workers by URL) finds them again.
"""

from __future__ import annotations

import concurrent.futures
import json
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.procs import ManagedProcess, start_router, start_worker
from harness.sse import data_payload
from router.up.launcher import RedisServer
from tests.support.polling import wait_until
from tests.support.router_calls import admin
from tests.support.router_configs import (
    ALICE,
    FAST_REGISTRY,
    WORKER_KEY,
    WORKER_KEY_ENV,
    auth_section,
    model_table,
    to_toml,
    worker_list,
)

pytestmark = pytest.mark.slow
RETRYABLE = {429, 502, 503}
NUM_STREAM_TOKENS = 400
# Room for every stream of a test on one worker: a preempted stream is silent until
# it is readmitted, which the idle timeout would take for a hung worker.
KV_CACHE_BYTES = "32MiB"
WORKER_FLAGS = ("--drain-timeout-s", "30")


@dataclass(frozen=True)
class Answer:
    """What one client got: the HTTP status, the text, usage, and an error event."""

    status: int
    text: str
    usage: dict[str, Any] | None
    error: Any = None


class Cluster:
    """Demo workers (restartable on their first port) behind router processes: one,
    or ``num_routers`` sharing state through ``redis``."""

    def __init__(self, tmp_path: Path, num_workers: int, num_routers: int = 1,
                 redis: RedisServer | None = None) -> None:
        self.redis = redis
        self.workers = {f"w{i}": start_worker(*WORKER_FLAGS, kv_cache_bytes=KV_CACHE_BYTES,
                                              wait=False, api_key=WORKER_KEY)
                        for i in range(num_workers)}
        for worker in self.workers.values():
            worker.wait_ready(120)
        self.ports = {name: int(w.url.rsplit(":", 1)[1]) for name, w in self.workers.items()}
        path = tmp_path / "router.toml"
        path.write_text(self._config())
        self.routers = [start_router(path, env={WORKER_KEY_ENV: WORKER_KEY})
                        for _ in range(num_routers)]
        self.router = self.routers[0]
        self.wait_routable(set(self.workers))

    def _config(self) -> str:
        redis = {"redis": {"url": self.redis.url, "key_prefix": "faults",
                           "heartbeat_interval_s": 0.2, "sync_interval_s": 0.2,
                           "command_timeout_s": 1.0}} if self.redis else {}
        return to_toml({
            "models": {"demo": model_table()},
            "policy": {"name": "round_robin"},
            "registry": FAST_REGISTRY,
            "proxy": {"first_byte_timeout_s": 20, "idle_timeout_s": 10},
            **redis,
            "auth": auth_section({"alice": {}}),
            "workers": worker_list({name: w.url for name, w in self.workers.items()},
                                   api_key_env=WORKER_KEY_ENV),
        })

    def ready_workers(self, router: ManagedProcess | None = None) -> set[str]:
        workers = admin(router or self.router, "/admin/workers")["workers"]
        return {w["id"] for w in workers if w["ready"]}

    def wait_routable(self, names: set[str], timeout_s: float = 60) -> None:
        for router in self.routers:
            def ready(router: ManagedProcess = router) -> set[str]:
                return self.ready_workers(router)

            wait_until(lambda ready=ready: ready() >= names, timeout_s, ready)

    def restart(self, name: str) -> None:
        self.workers[name] = start_worker("--port", str(self.ports[name]), *WORKER_FLAGS,
                                          kv_cache_bytes=KV_CACHE_BYTES, api_key=WORKER_KEY)

    def stop(self) -> None:
        for router in self.routers:
            router.stop()
        for worker in self.workers.values():
            worker.stop()


@pytest.fixture
def cluster_of(tmp_path: Path) -> Iterator[Any]:
    clusters: list[Cluster] = []

    def make(num_workers: int, num_routers: int = 1, redis: RedisServer | None = None
             ) -> Cluster:
        clusters.append(Cluster(tmp_path, num_workers, num_routers, redis))
        return clusters[-1]

    yield make
    for cluster in clusters:
        cluster.stop()


def body(i: int, max_tokens: int, stream: bool, seed: int | None = None) -> dict[str, Any]:
    sampling = {"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed}
    return {"model": "demo", "prompt": f"request {i}: tell me about prefix caches", "stream": stream,
            "max_tokens": max_tokens, "ignore_eos": True, **sampling,
            **({"stream_options": {"include_usage": True}} if stream else {})}


def client_answer(router: ManagedProcess, request: dict[str, Any],
                  on_chunk=lambda: None) -> Answer:
    """One completion through the router, streamed or not, as the client saw it."""
    data = json.dumps(request).encode()
    http = urllib.request.Request(f"{router.url}/v1/completions", data=data, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {ALICE}"})
    try:
        with urllib.request.urlopen(http, timeout=120) as response:
            if not request["stream"]:
                whole = json.loads(response.read())
                return Answer(200, whole["choices"][0]["text"], whole["usage"])
            texts, usage, error = [], None, None
            for raw in response:
                payload = data_payload(raw.decode())
                if payload is None or payload == "[DONE]":
                    continue
                event = json.loads(payload)
                if "error" in event:
                    error = event["error"]
                    continue
                usage = event.get("usage") or usage
                for choice in event["choices"]:
                    texts.append(choice["text"])
                    on_chunk()
            return Answer(200, "".join(texts), usage, error)
    except urllib.error.HTTPError as exc:
        return Answer(exc.code, "", None, exc.read().decode(errors="replace"))


def assert_same(answer: Answer, reference: Answer, router: ManagedProcess) -> None:
    assert answer.status == 200 and answer.error is None, (answer, router.log_text()[-4000:])
    assert answer.text == reference.text
    assert answer.usage["prompt_tokens"] == reference.usage["prompt_tokens"]
    assert answer.usage["completion_tokens"] == reference.usage["completion_tokens"]


def test_streams_cut_by_a_killed_worker_resume_token_for_token(cluster_of) -> None:
    """Streams start one after another, so round-robin puts the even ones (greedy 0,
    2, 4, 6 and seeded 8) on w0, which is then killed mid-stream."""
    cluster = cluster_of(2)
    seeds = [None] * 8 + [11, 12]
    requests = [body(i, NUM_STREAM_TOKENS, True, seed) for i, seed in enumerate(seeds)]
    references = [client_answer(cluster.router, body(i, NUM_STREAM_TOKENS, False, seed))
                  for i, seed in enumerate(seeds)]
    chunks = [0] * len(requests)

    def run(i: int) -> Answer:
        return client_answer(cluster.router, requests[i],
                             lambda: chunks.__setitem__(i, chunks[i] + 1))

    with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
        answers = []
        for i in range(len(requests)):
            answers.append(pool.submit(run, i))
            wait_until(lambda i=i: chunks[i] >= 1, 60, lambda: chunks)
        wait_until(lambda: min(chunks) >= 10, 60, lambda: chunks)
        cluster.workers["w0"].proc.kill()
        results = [a.result(120) for a in answers]
    for answer, reference in zip(results, references, strict=True):
        assert_same(answer, reference, cluster.router)
    metrics = urllib.request.urlopen(f"{cluster.router.metrics_url}/metrics").read().decode()
    retries = [line for line in metrics.splitlines() if line.startswith("router_retries_total")]
    assert float(retries[0].split()[-1]) >= len(requests) // 2


def test_sigterm_on_the_router_finishes_its_streams_then_exits(cluster_of) -> None:
    cluster = cluster_of(1)
    chunks = [0]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        streams = [pool.submit(client_answer, cluster.router, body(i, 600, True),
                               lambda: chunks.__setitem__(0, chunks[0] + 1)) for i in range(2)]
        wait_until(lambda: chunks[0] >= 10, 60, lambda: chunks)
        cluster.router.proc.terminate()
        time.sleep(0.5)
        with pytest.raises(urllib.error.URLError):
            client_answer(cluster.router, body(9, 4, False))
        for stream in streams:
            answer = stream.result(120)
            assert answer.status == 200 and answer.error is None
            assert answer.usage["completion_tokens"] == 600
    assert cluster.router.proc.wait(30) == 0


class SteadyLoad:
    """Client threads sending the reference requests in turn until stopped."""

    def __init__(self, router: ManagedProcess, requests: list[dict[str, Any]],
                 num_clients: int) -> None:
        self.answers: list[tuple[int, Answer]] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(router, requests, c))
                         for c in range(num_clients)]
        for thread in self._threads:
            thread.start()

    def _run(self, router: ManagedProcess, requests: list[dict[str, Any]], client: int) -> None:
        i = client
        while not self._stop.is_set():
            index = i % len(requests)
            self.answers.append((index, client_answer(router, requests[index])))
            i += 1

    def stop(self) -> list[tuple[int, Answer]]:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)
        return self.answers


def test_rolling_restart_by_sigterm_fails_no_request(cluster_of) -> None:
    cluster = cluster_of(2)
    requests = [body(i, 48, i % 2 == 0) for i in range(6)]
    references = [client_answer(cluster.router, r) for r in requests]
    load = SteadyLoad(cluster.router, requests, num_clients=3)
    try:
        for name in list(cluster.workers):
            time.sleep(1.0)
            worker = cluster.workers[name]
            worker.proc.terminate()
            wait_until(lambda name=name: name not in cluster.ready_workers(), 10)
            index = admin(cluster.router, "/admin/index")
            assert index["workers"][name]["num_blocks"] == 0
            assert name not in index["index"]["num_blocks"]
            assert worker.proc.wait(40) == 0
            cluster.restart(name)
            cluster.wait_routable({name})
        time.sleep(1.0)
    finally:
        answers = load.stop()
    assert len(answers) >= 10
    for index, answer in answers:
        assert_same(answer, references[index], cluster.router)


def test_chaos_kills_and_restarts_under_load(cluster_of, redis_server) -> None:
    """Two routers on one Redis; three SIGKILL + restarts of random workers and one
    Redis restart (after the second kill) under load through both routers."""
    cluster = cluster_of(3, num_routers=2, redis=redis_server)
    requests = [body(i, 32, i % 2 == 0) for i in range(6)]
    references = [client_answer(cluster.router, r) for r in requests]
    chaos = random.Random(20261201)
    loads = [SteadyLoad(router, requests, num_clients=2) for router in cluster.routers]
    try:
        for kill in range(3):
            time.sleep(chaos.uniform(0.5, 1.5))
            name = chaos.choice(sorted(cluster.workers))
            cluster.workers[name].proc.kill()
            cluster.workers[name].proc.wait()
            time.sleep(chaos.uniform(0.2, 1.0))
            cluster.restart(name)
            if kill == 1:
                redis_server.stop()
                time.sleep(chaos.uniform(0.2, 1.0))
                redis_server.start()
        cluster.wait_routable(set(cluster.workers))
        time.sleep(1.0)
    finally:
        answers = [answer for load in loads for answer in load.stop()]
    assert len(answers) >= 10
    for index, answer in answers:
        if answer.status in RETRYABLE:
            continue
        assert_same(answer, references[index], cluster.router)
    assert sum(a.status == 200 for _, a in answers) >= len(answers) // 2
    for worker in cluster.workers.values():
        wait_until(lambda worker=worker: blocks_settled(worker), 20)


def blocks_settled(worker: ManagedProcess) -> bool:
    """Every KV block of ``worker`` is free or cached (none held by a request)."""
    _, text = worker.get_json("/metrics")
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("kv_blocks_free", "kv_blocks_cached", "kv_blocks_total"):
            values[name] = float(value)
    return values["kv_blocks_free"] + values["kv_blocks_cached"] == values["kv_blocks_total"]
