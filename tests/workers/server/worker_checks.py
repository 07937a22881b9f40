"""Checks on a running worker through its HTTP status routes."""

from __future__ import annotations

import time

from harness.procs import ManagedProcess


def used_blocks_settle(worker: ManagedProcess, timeout_s: float = 10.0) -> dict:
    """Poll /info until no block is in use and no request runs or waits."""
    deadline = time.monotonic() + timeout_s
    while True:
        _, info = worker.get_json("/info")
        load = info["load"]
        if info["kv"]["num_used_blocks"] == 0 and not load["num_requests_running"] + load["num_requests_waiting"]:
            return info
        assert time.monotonic() < deadline, f"blocks still in use: {info['kv']} {load}"
        time.sleep(0.05)


def metric(worker: ManagedProcess, name: str) -> float:
    """The value of an unlabelled sample in /metrics."""
    _, text = worker.get_json("/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")
