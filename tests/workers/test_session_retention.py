"""Sessions that return, on a real worker process (docs/kv-cache.md, "Sessions that
return"): a request naming a session and a retention hint has its prompt's blocks kept
through an eviction wave that takes an unhinted prompt's, and let go after the hinted
seconds (the next wave takes them); a scope's retentions stay within its bound (a
newer one displaces its older, one alone past it is refused), and the blocks it keeps
are referenced only until the deadline."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.procs import ManagedProcess, start_worker
from tests.support.metric_samples import worker_metric as metric
from tests.support.polling import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("session_retention")]
B = 16
# 4 MiB of demo KV: 64 blocks. A scope keeps at most 19 blocks, the worker 32.
CONFIG = "[retention]\nmax_scope_retained_pool_fraction = 0.3\nmax_retained_pool_fraction = 0.5\n"


def prompt(seed: int, num_blocks: int) -> list[int]:
    """``num_blocks`` whole blocks and 3 more tokens of demo-vocabulary ids."""
    return [(seed * 53 + i * 13) % 200 + 20 for i in range(num_blocks * B + 3)]


def generate(worker: ManagedProcess, token_ids: list[int], scope: str = "t1",
             **session: object) -> dict:
    status, answer = worker.post_json("/generate", {
        "token_ids": token_ids, "scope": scope,
        "sampling": {"max_tokens": 1, "temperature": 0}, **session})
    assert status == 200, answer
    return answer


def cached(worker: ManagedProcess, token_ids: list[int], scope: str = "t1") -> int:
    """Cached tokens of ``token_ids`` when sent again (which caches them again)."""
    return generate(worker, token_ids, scope)["usage"]["cached_tokens"]


def eviction_wave(worker: ManagedProcess, seed: int) -> None:
    """Prompts of another scope filling the whole pool twice over."""
    for i in range(6):
        generate(worker, prompt(seed + i, 20), scope="crowd")


@pytest.fixture(scope="module")
def worker(tmp_path_factory) -> Iterator[ManagedProcess]:
    path = Path(tmp_path_factory.mktemp("retention")) / "worker.toml"
    path.write_text(CONFIG)
    started = start_worker("--config", str(path), api_key="retention-key")
    try:
        yield started
    finally:
        started.stop()


def retained(worker: ManagedProcess) -> float:
    return metric(worker, "kv_retained_blocks")


def keeps(worker: ManagedProcess, num_blocks: int) -> bool:
    """Wait until ``worker`` keeps ``num_blocks`` blocks for sessions (a retention
    begins as its request ends, just after the answer is sent)."""
    return wait_until(lambda: retained(worker) == num_blocks, 10,
                      lambda: f"{num_blocks} blocks kept (now {retained(worker)})")


def outcome(worker: ManagedProcess, name: str) -> float:
    return metric(worker, "kv_retentions_total", {"outcome": name})


def test_a_hint_keeps_a_sessions_blocks_through_a_wave_and_lets_them_go_after(worker):
    session, plain = prompt(1, 10), prompt(2, 10)
    generate(worker, session, session_id="agent-1", retention_s=4.0)
    generate(worker, plain)
    assert keeps(worker, 10)
    eviction_wave(worker, 100)
    assert cached(worker, plain) == 0  # the wave took the unhinted prompt
    assert cached(worker, session) == 10 * B  # and kept the session's
    wait_until(lambda: retained(worker) == 0, 10, "the retention's deadline")
    eviction_wave(worker, 200)
    assert cached(worker, session) == 0
    assert metric(worker, "kv_retentions_total", {"outcome": "expired"}) >= 1


def test_a_scope_keeps_no_more_than_its_bound(worker):
    generate(worker, prompt(3, 12), session_id="a", retention_s=30.0)
    assert keeps(worker, 12)
    generate(worker, prompt(4, 12), session_id="b", retention_s=60.0)  # displaces a
    wait_until(lambda: outcome(worker, "displaced") == 1, 10, "a displaced")
    assert keeps(worker, 12)
    refused = outcome(worker, "refused")
    generate(worker, prompt(5, 25), session_id="c", retention_s=60.0)  # alone past 19
    wait_until(lambda: outcome(worker, "refused") == refused + 1, 10, "c refused")
    generate(worker, prompt(6, 4), session_id="b", retention_s=2.0)  # replaces b's
    assert keeps(worker, 4) and outcome(worker, "replaced") >= 1
    generate(worker, prompt(7, 4), scope="t2", session_id="b", retention_s=2.0)
    assert keeps(worker, 8)  # the same session id in another scope is another session
    wait_until(lambda: retained(worker) == 0, 10, "both deadlines")
    wait_until(lambda: worker.get_json("/info")[1]["kv"]["num_used_blocks"] == 0, 10,
               "no block referenced")
