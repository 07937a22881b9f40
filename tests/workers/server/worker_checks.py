"""Checks on a running worker through its HTTP status routes."""

from __future__ import annotations

from harness.procs import ManagedProcess
from tests.support.polling import wait_until


def used_blocks_settle(worker: ManagedProcess, timeout_s: float = 10.0) -> dict:
    """Poll /info until no block is in use and no request runs or waits; that /info."""
    def settled() -> dict | None:
        _, info = worker.get_json("/info")
        load = info["load"]
        idle = not load["num_requests_running"] + load["num_requests_waiting"]
        return info if info["kv"]["num_used_blocks"] == 0 and idle else None

    return wait_until(settled, timeout_s, lambda: f"no block in use: {worker.get_json('/info')[1]}",
                      interval_s=0.05)


def metric(worker: ManagedProcess, name: str) -> float:
    """The value of an unlabelled sample in /metrics."""
    _, text = worker.get_json("/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")
