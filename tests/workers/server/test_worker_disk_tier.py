"""A worker with a disk KV tier, stopped and started again on the same directory and
secret: it re-announces its disk blocks under its new epoch and serves the same
prompt with cached tokens read back from disk."""

from __future__ import annotations

import json

import pytest

from harness.procs import start_worker, stream_lines
from tests.workers.server.worker_checks import metric

pytestmark = pytest.mark.slow

DOC = [(13 * i + 5) % 251 for i in range(64)]  # 4 blocks of 16


def disk_worker(directory):
    # demo KV is 64 KiB a block: a 16-block host tier, a 64-block disk tier
    return start_worker("--host-cache-bytes", "1MiB", "--disk-cache-dir", str(directory),
                        "--disk-cache-bytes", "4MiB")


def generate(worker, token_ids: list[int]) -> dict:
    status, body = worker.post_json("/generate", {
        "token_ids": token_ids, "sampling": {"max_tokens": 2, "temperature": 0}})
    assert status == 200, body
    return body


def test_a_restarted_worker_serves_a_prompt_from_its_disk_tier(tmp_path):
    worker = disk_worker(tmp_path)
    try:
        assert generate(worker, DOC + [1, 2, 3])["usage"]["cached_tokens"] == 0
        first_epoch = worker.get_json("/ready")[1]["epoch"]
    finally:
        assert worker.stop() == 0  # SIGTERM: the cache is spilled to disk
    worker = disk_worker(tmp_path)
    try:
        snapshot = [json.loads(line) for line in stream_lines(f"{worker.url}/kv/events")
                    if line.strip()]
        assert snapshot[0]["type"] == "cleared" and snapshot[0]["epoch"] != first_epoch
        disk_tokens = [token for event in snapshot if event.get("medium") == "disk"
                       for block in event["blocks"] for token in block["tokens"]]
        assert set(DOC) <= set(disk_tokens)
        assert generate(worker, DOC + [9, 9, 9])["usage"]["cached_tokens"] == 64
        assert metric(worker, "kv_disk_hit_blocks_total") >= 4  # the self-test's may add
        assert metric(worker, "kv_disk_auth_failures_total") == 0
    finally:
        worker.stop()
