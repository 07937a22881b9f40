"""End to end: a burst of requests for one cold document, through a router process in
front of four timed worker processes (``timed:llama3-8b-h100`` 40 times slower than
the profile, so the document's first prefill takes seconds). The first request goes
where the document's hash says; the five that follow while that prefill still runs
go to the same worker, which is computing the prefix they share (docs/router-index.md,
"Choosing a worker"), and find at least part of it cached there, instead of
prefilling the whole document again on idle workers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from harness.procs import ManagedProcess, start_router, start_worker
from tests.support.router_calls import admin, openai_complete, wait_until_ready
from tests.support.router_configs import WORKER_KEY, WORKER_KEY_ENV, keyed_demo_config, to_toml

pytestmark = pytest.mark.slow
TIMED = ("--model", "timed:llama3-8b-h100", "--served-model-name", "demo",
         "--time-scale", "40")
NUM_WORKERS = 4
DOCUMENT = " ".join(f"fact {i} holds." for i in range(500))  # about 3,000 tokens


@pytest.fixture
def cluster(tmp_path) -> Iterator[ManagedProcess]:
    workers = [start_worker(*TIMED, kv_cache_bytes="256MiB", wait=False, api_key=WORKER_KEY)
               for _ in range(NUM_WORKERS)]
    router = None
    try:
        for worker in workers:
            worker.wait_ready(120)
        path = tmp_path / "router.toml"
        path.write_text(to_toml(keyed_demo_config({f"w{i}": w.url
                                                   for i, w in enumerate(workers)})))
        router = start_router(path, env={WORKER_KEY_ENV: WORKER_KEY})
        wait_until_ready(router)
        yield router
    finally:
        if router is not None:
            router.stop()
        for worker in workers:
            worker.stop()


def requests_sent(router: ManagedProcess) -> dict[str, int]:
    return {w["id"]: w["stats"]["num_requests"]
            for w in admin(router, "/admin/workers")["workers"]}


def test_a_burst_within_a_cold_documents_first_prefill_goes_to_the_worker_computing_it(
        cluster) -> None:
    def ask(question: int) -> Any:
        return openai_complete(cluster, f"{DOCUMENT}\nQuestion {question}: why?")

    with ThreadPoolExecutor(6) as pool:
        first = pool.submit(ask, 0)
        time.sleep(0.3)  # routed and prefilling: its blocks are not stored yet
        burst = [pool.submit(ask, i) for i in range(1, 6)]
        answers = [first.result(), *(f.result() for f in burst)]
    sent = requests_sent(cluster)
    assert sorted(sent.values()) == [0] * (NUM_WORKERS - 1) + [6], sent
    cached = [a.usage.prompt_tokens_details.cached_tokens for a in answers]
    assert cached[0] <= 1 and all(n > 0 for n in cached[1:]), cached
