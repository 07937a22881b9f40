"""A worker process with an FP8 KV cache, calibrated scales and a host tier with a TTL:
what it reports (KV format, identity, plan), and a prefix pushed out of the device
coming back from host memory."""

from __future__ import annotations

import urllib.request
from importlib.metadata import version
from pathlib import Path

import pytest

from harness.procs import start_worker
from workers.kv.tensors import KV_LAYOUT_VERSION

# Its module-scoped processes start once: the whole module runs on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("worker_kv_formats")]

REPO = Path(__file__).resolve().parents[3]
SCALES = REPO / "configs" / "kv-scales" / "demo.json"
DOC = [(13 * i + 5) % 251 for i in range(64)]  # 4 blocks of 16


@pytest.fixture(scope="module")
def worker():
    # 11 FP8 device blocks of 16 KiB (after the margin); a host tier of 64 blocks
    process = start_worker("--kv-cache-dtype", "fp8_e4m3", "--kv-scales", str(SCALES),
                           "--host-cache-bytes", str(64 * 16 * 1024), "--host-ttl-s", "3600",
                           kv_cache_bytes=str(12 * 16 * 1024))
    yield process
    process.stop()


def generate(worker, token_ids: list[int], **fields) -> dict:
    status, body = worker.post_json("/generate", {
        "token_ids": token_ids, "sampling": {"max_tokens": 2, "temperature": 0}, **fields})
    assert status == 200, body
    return body


def test_ready_and_info_report_the_kv_dtype_and_the_scale_source(worker):
    status, ready = worker.get_json("/ready")
    assert status == 200
    assert ready["kv_dtype"] == "float8_e4m3fn"
    assert str(SCALES) in ready["kv_scales"]
    assert ready["namespace"]["kv_scales_digest"] and ready["namespace"]["kv_dtype"] == "float8_e4m3fn"
    assert ready["engine_version"] == version("radix-router")
    assert ready["attention_backend"] == "torch-reference"
    assert ready["decode_graph_sizes"] == []  # the CPU runs every step eagerly
    assert ready["namespace"]["kv_layout_version"] == KV_LAYOUT_VERSION
    status, info = worker.get_json("/info")
    assert status == 200 and info["kv_scales"] == ready["kv_scales"]
    assert info["kv_plan"]["sizing_rule"] == "kv_cache_bytes"


def test_an_evicted_prefix_is_served_from_the_host_tier_as_cached(worker):
    generate(worker, DOC + [1, 2, 3], max_cached_tokens=4096)
    for i in range(3):  # push DOC out of the 11-block device pool
        generate(worker, [(7 * j + 50 * i + 3) % 251 for j in range(120)])
    body = generate(worker, DOC + [9, 9, 9])
    assert body["usage"]["cached_tokens"] == 64
    with urllib.request.urlopen(f"{worker.url}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    assert "kv_host_hit_blocks_total 4.0" in metrics
    assert "kv_host_blocks_to_host_total 0.0" not in metrics
    assert "kv_host_expired_blocks_total 0.0" in metrics, "a TTL of an hour: nothing expired"
    assert "kv_host_auth_failures_total 0.0" in metrics


def test_a_negative_quota_is_a_400_naming_the_field(worker):
    status, body = worker.post_json("/generate", {"token_ids": [1, 2], "max_cached_tokens": -1})
    assert status == 400 and body["error"]["param"] == "max_cached_tokens"
