"""A producer's holds behind the real router in PD mode (docs/pd.md, "Holds"): a decode
attempt that fails releases its hold at once (the router acks what it drops); clients
hanging up mid-request leave both workers' pools at their baseline; a prefill worker
past its hold cap refuses the leg and the request is served whole on the decode worker
(a counted fallback, never an error), and the router reads the held blocks in its
load."""

from __future__ import annotations

import asyncio
import random

import aiohttp
import pytest

from harness.procs import ManagedProcess, start_router, start_worker
from tests.support.metric_samples import router_metric
from tests.support.metric_samples import worker_metric as metric
from tests.support.polling import wait_until
from tests.support.router_calls import ALICE, admin, base_url, complete, wait_until_ready
from tests.support.router_configs import (
    WORKER_KEY,
    WORKER_KEY_ENV,
    pd_config,
)

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e_pd_holds")]
PRODUCER = '{"kv_role": "kv_producer"}'
CONSUMER = '{"kv_role": "kv_consumer"}'
HOLD_S = 5  # the producers' hold deadline


def used_blocks(worker: ManagedProcess) -> int:
    """Blocks some request, hold or import references (0 on an idle worker)."""
    return worker.get_json("/info")[1]["kv"]["num_used_blocks"]


def at_baseline(worker: ManagedProcess, timeout_s: float) -> bool:
    """Wait until ``worker`` references no block; True, or AssertionError."""
    return wait_until(lambda: used_blocks(worker) == 0, timeout_s,
                      lambda: f"no block in use (now {used_blocks(worker)})")


def pd_router(directory, prefill: ManagedProcess, decode: ManagedProcess,
              decode_key: str = WORKER_KEY) -> ManagedProcess:
    """A ready router over prefill worker p0 and decode worker d0 (its key
    ``decode_key``), PD from 32 uncached tokens."""
    path = pd_config(directory, prefill, "d0", decode, "DECODE_KEY")
    router = start_router(path, env={WORKER_KEY_ENV: WORKER_KEY, "DECODE_KEY": decode_key})
    wait_until_ready(router)
    return router


def document(seed: int) -> str:
    """A prompt of about 150 tokens (9 blocks) that no other test sends."""
    words = random.Random(seed).choices(["cache", "block", "prefill", "decode", "tenant",
                                         "worker", "router", "hold"], k=20)
    return f"Document {seed}: " + " ".join(words)


async def _hang_up(url: str, prompts: list[str], max_wait_s: float) -> int:
    """Complete each of ``prompts`` through the router at once, hanging up each after
    a random time under ``max_wait_s``; how many hung up."""
    rng = random.Random(3)
    hung_up = 0
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {ALICE}"}) as session:
        async def one(prompt: str) -> None:
            nonlocal hung_up
            try:
                async with asyncio.timeout(rng.uniform(0.02, max_wait_s)):
                    async with session.post(url, json={"model": "demo", "prompt": prompt,
                                                       "max_tokens": 8}) as response:
                        await response.read()
            except TimeoutError:
                hung_up += 1
        await asyncio.gather(*(one(prompt) for prompt in prompts))
    return hung_up


@pytest.fixture(scope="module")
def producer():
    """A prefill worker holding blocks ``HOLD_S`` s, half its pool for one tenant."""
    worker = start_worker("--kv-transfer-config", PRODUCER, "--kv-transfer-timeout-s",
                          str(HOLD_S), "--kv-transfer-max-scope-held-fraction", "0.5",
                          api_key=WORKER_KEY)
    yield worker
    worker.stop()


def test_a_failed_decode_attempt_releases_its_hold_at_once(producer, tmp_path):
    decode = start_worker("--kv-transfer-config", CONSUMER, api_key="another-key")
    router = pd_router(tmp_path, producer, decode, "another-key")  # d0 cannot sign pulls
    try:
        status, answer = complete(router, document(1), max_tokens=4, temperature=0)
        assert status == 200, answer  # retried whole on d0
        modes = {m: router_metric(router, "router_pd_requests_total", {"mode": m})
                 for m in ("disaggregated", "fallback", "aggregated")}
        assert modes["disaggregated"] == 1, modes
        assert at_baseline(producer, HOLD_S / 2)  # released by the router, not the deadline
        assert metric(producer, "kv_transfer_released_holds_total",
                      {"reason": "abandoned"}) == 1
        assert metric(producer, "kv_transfer_expired_holds_total") == 0
        assert at_baseline(decode, 10)
    finally:
        router.stop()
        decode.stop()


def test_clients_hanging_up_leave_both_pools_at_their_baseline(producer, tmp_path):
    decode = start_worker("--kv-transfer-config", CONSUMER, api_key=WORKER_KEY)
    router = pd_router(tmp_path, producer, decode)
    try:
        prompts = [document(100 + i) for i in range(32)]
        url = f"{base_url(router)}/v1/completions"
        assert asyncio.run(_hang_up(url, prompts, 1.0)) > 0
        assert at_baseline(producer, HOLD_S + 15) and at_baseline(decode, 15)
        for worker in (producer, decode):
            assert metric(worker, "kv_transfer_orphan_pins_freed_total") == 0
            assert metric(worker, "kv_transfer_held_blocks") == 0
        status, answer = complete(router, document(200), max_tokens=4, temperature=0)
        assert status == 200, answer  # the fleet still serves
    finally:
        router.stop()
        decode.stop()


def test_a_prefill_worker_past_its_hold_cap_leaves_requests_whole(tmp_path):
    capped = start_worker("--kv-transfer-config", PRODUCER,
                          "--kv-transfer-max-held-fraction", "0.05", api_key=WORKER_KEY)
    decode = start_worker("--kv-transfer-config", CONSUMER, api_key=WORKER_KEY)
    router = pd_router(tmp_path, capped, decode)
    try:
        cap = capped.get_json("/info")[1]["load"]["max_held_blocks"]
        assert 0 < cap < 5  # smaller than any of these prompts' holds
        wait_until(lambda: {w["id"]: w for w in admin(router, "/admin/workers")["workers"]}
                   ["p0"]["load"]["max_held_blocks"] == cap,
                   what="the cap in the router's polled load")
        for seed in (300, 301):
            status, answer = complete(router, document(seed), max_tokens=4, temperature=0)
            assert status == 200, answer
        assert router_metric(router, "router_pd_requests_total", {"mode": "fallback"}) == 2
        assert metric(capped, "kv_transfer_refused_holds_total", {"cap": "producer"}) == 2
        assert metric(decode, "kv_transfer_blocks_received_total") == 0
        assert at_baseline(capped, 10) and at_baseline(decode, 10)
    finally:
        router.stop()
        decode.stop()
        capped.stop()
