"""Issue 9 over HTTP: on a small KV pool, prompts that share a mid-block prefix all run
(each hitting the shared prefix), a prompt no empty pool could hold is a 413 before it
queues, and once nothing runs, evicting the cache gives every block back."""

from __future__ import annotations

import pytest

from harness.procs import start_worker
from tests.workers.server.worker_checks import metric, used_blocks_settle

pytestmark = pytest.mark.slow


def document(i: int) -> str:
    """A 672-token demo prompt (42 blocks of 16): the first blocks of any two share
    only the text ``document `` (a hit that ends inside the first block)."""
    return f"document {i}: " + " ".join(f"w{i}x{j}" for j in range(110))


def test_prompts_larger_than_the_free_pool_run_after_a_mid_block_hit() -> None:
    worker = start_worker(kv_cache_bytes="4194304")
    try:
        _, info = worker.get_json("/info")
        total = info["kv"]["num_total_blocks"]
        for i in range(4):
            status, body = worker.post_json(
                "/v1/completions", {"model": "demo", "prompt": document(i), "max_tokens": 1}
            )
            assert status == 200, body
            # the hit is the shared "document " (BOS + 9 bytes), ending inside block 0
            expected = 10 if i else 0
            assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == expected, body
        info = used_blocks_settle(worker)
        queried = metric(worker, "prefix_cache_queries_tokens_total")
        status, body = worker.post_json(
            "/v1/completions", {"model": "demo", "prompt": "z" * (total * 16), "max_tokens": 1}
        )  # more than an empty pool holds: refused at once, never queued
        assert (status, body["error"]["code"]) == (413, "context_length_exceeded"), body
        assert metric(worker, "prefix_cache_queries_tokens_total") == queried
        assert info["kv"]["num_free_blocks"] + info["kv"]["num_cached_blocks"] == total, info["kv"]
        assert metric(worker, "engine_stalls_total") == 0
    finally:
        worker.stop()
