"""End to end: flow control in a router process in front of one timed worker process
with two batch slots (``timed:llama3-8b-h100``, slowed down so a request takes about a
second): one tenant's flood waits in the router, not in the worker, so another
tenant's request goes next; a queued request whose client leaves is never sent; a
request queued past its band's TTL is refused with 429 and Retry-After."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness.procs import ManagedProcess, start_router, start_worker
from router.front.auth import hash_key
from tests.support.metric_samples import router_metric, worker_metric
from tests.support.router_calls import base_url, complete, wait_until_ready
from tests.support.router_configs import (
    ALICE,
    BOB,
    WORKER_KEY,
    WORKER_KEY_ENV,
    keyed_demo_config,
    to_toml,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("flow_control")]
TIMED = ("--model", "timed:llama3-8b-h100", "--served-model-name", "demo",
         "--time-scale", "40", "--max-num-seqs", "2")
MAX_TOKENS = 16
SHORT_TTL_S = 1.5
CAROL = "key-carol"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> Iterator[tuple[ManagedProcess, ManagedProcess]]:
    """(router with flow control, its one worker)."""
    worker = start_worker(*TIMED, kv_cache_bytes="256MiB", api_key=WORKER_KEY)
    router = None
    try:
        config = keyed_demo_config({"w0": worker.url})
        config["flow"] = {"enabled": True, "bands": [
            {"name": "interactive", "queue_ttl_s": 60.0},
            {"name": "standard", "queue_ttl_s": 60.0},
            {"name": "short", "queue_ttl_s": SHORT_TTL_S}]}
        config["auth"]["tenants"]["carol"] = {"key_digests": [hash_key(CAROL)], "band": "short"}
        path = tmp_path_factory.mktemp("flow") / "router.toml"
        path.write_text(to_toml(config))
        router = start_router(path, env={WORKER_KEY_ENV: WORKER_KEY})
        wait_until_ready(router)
        yield router, worker
    finally:
        if router is not None:
            router.stop()
        worker.stop()


def _finished(worker: ManagedProcess) -> float:
    return worker_metric(worker, "request_prompt_tokens_count")


def _ask(router: ManagedProcess, text: str, key: str) -> float:
    """Send one request; the time its answer came back."""
    status, answer = complete(router, text, key=key, max_tokens=MAX_TOKENS, timeout_s=120)
    assert status == 200, answer
    return time.monotonic()


def test_another_tenants_request_goes_ahead_of_a_flood_queued_in_the_router(fleet) -> None:
    router, _ = fleet
    with ThreadPoolExecutor(10) as pool:
        flood = [pool.submit(_ask, router, f"flood {i}: tell me more.", ALICE)
                 for i in range(8)]
        time.sleep(1.0)
        victim = pool.submit(_ask, router, "victim: one question.", BOB)
        victim_done = victim.result()
        flood_done = [f.result() for f in flood]
    # Two slots: two flood requests run, six wait in the router. The victim's request
    # starts fair (its tenant has had no share yet) and takes the next free slot.
    assert sum(done > victim_done for done in flood_done) >= 4, (victim_done, flood_done)


def test_a_queued_request_whose_client_leaves_is_never_sent(fleet) -> None:
    router, worker = fleet
    before = _finished(worker)
    with ThreadPoolExecutor(2) as pool:
        busy = [pool.submit(_ask, router, f"busy {i}", ALICE) for i in range(2)]
        time.sleep(0.5)
        body = (b'{"model": "demo", "prompt": "gone", "max_tokens": 4}')
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {BOB}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        host, port = base_url(router).removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(head.encode() + body)
            time.sleep(0.5)  # queued behind the two busy requests
        [f.result() for f in busy]
    assert _finished(worker) == before + 2
    cancelled = router_metric(router, "router_flow_cancelled_total", {"band": "standard"})
    assert cancelled >= 1


def test_a_request_queued_past_its_bands_ttl_is_refused_with_retry_after(fleet) -> None:
    router, _ = fleet
    with ThreadPoolExecutor(3) as pool:
        busy = [pool.submit(_ask, router, f"long {i}", ALICE) for i in range(2)]
        time.sleep(0.5)
        request = urllib.request.Request(
            f"{base_url(router)}/v1/completions", method="POST",
            data=b'{"model": "demo", "prompt": "late", "max_tokens": 4}',
            headers={"Authorization": f"Bearer {CAROL}", "Content-Type":
                     "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        [f.result() for f in busy]
    assert refused.value.code == 429
    assert int(refused.value.headers["Retry-After"]) >= 1
    shed = router_metric(router, "router_flow_shed_total", {"band": "short", "reason": "ttl"})
    assert shed == 1
