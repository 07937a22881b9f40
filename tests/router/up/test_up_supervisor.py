"""`radix-router up` supervises: a SIGKILLed worker is restarted on its port while the
other keeps answering, and the router sees it leave and come back under a new epoch
and routes to it again; a child killed at every start is given up on while `up`
keeps serving; only SIGTERM ends `up`, and then every child it ever started is gone.
"""

from __future__ import annotations

import concurrent.futures
import signal
import time
from pathlib import Path

import pytest

from harness.up_process import ADMIN_KEY, TENANT_KEYS, UpProcess, alive, all_pids, up_config
from tests.support.polling import wait_until
from tests.support.router_calls import admin, complete

pytestmark = pytest.mark.slow
POLICY = {"restart_backoff_initial_s": 0.2, "restart_backoff_max_s": 1.0, "max_crashes": 3,
          "crash_window_s": 300}


def start(tmp_path: Path) -> UpProcess:
    path = tmp_path / "up.toml"
    path.write_text(up_config(num_workers=2, launch=POLICY))
    up = UpProcess(path)
    up.wait_banner()
    return up


def workers(router: str) -> dict[str, dict]:
    return {w["id"]: w for w in admin(router, "/admin/workers", key=ADMIN_KEY)["workers"]}


def status_of(router: str, prompt: str) -> int:
    """The status of a greedy four-token completion for alice."""
    return complete(router, prompt, TENANT_KEYS["alice"], max_tokens=4, full_length=False,
                    temperature=0)[0]


def test_killed_worker_is_restarted_and_routed_to_again(tmp_path: Path) -> None:
    up = start(tmp_path)
    try:
        router = up.router_urls()[0]
        wait_until(lambda: all(w["ready"] for w in workers(router).values()), 30, "ready")
        before = workers(router)["w1"]
        w1_url, killed = up.url("w1"), up.signal_child("w1", signal.SIGKILL)
        seen_down = False
        for i in range(10):  # the other worker answers everything meanwhile
            assert status_of(router, f"while w1 is down {i}") == 200
            seen_down |= not workers(router)["w1"]["ready"]
        up.wait_line(r"^\[w1\] restarted \(pid \d+\)", 120)
        assert up.proc.poll() is None and not alive(killed) and up.url("w1") == w1_url
        wait_until(lambda: workers(router)["w1"]["ready"], 30, "w1 ready again")
        after = workers(router)["w1"]
        assert seen_down and after["epoch"] != before["epoch"]
        num_before = after["stats"]["num_requests"]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            assert set(pool.map(lambda i: status_of(router, f"after {i}"), range(8))) == {200}
        assert workers(router)["w1"]["stats"]["num_requests"] > num_before  # round robin
        pids = all_pids(up, ["w0", "w1", "router"])
        assert up.stop(signal.SIGTERM) == 0
        assert len(pids) == 4 and not any(alive(pid) for pid in pids)
    finally:
        up.stop(signal.SIGKILL)


def test_child_killed_at_every_start_is_given_up_on(tmp_path: Path) -> None:
    up = start(tmp_path)
    try:
        router = up.router_urls()[0]
        for crash in range(POLICY["max_crashes"]):
            start_line = len(up.lines)
            up.signal_child("w1", signal.SIGKILL)
            if crash < POLICY["max_crashes"] - 1:
                up.wait_line(r"^\[w1\] started \(pid \d+\)", 30, start_line)
        up.wait_line(r"^\[w1\] .*giving up, it stays down", 30)
        time.sleep(2 * POLICY["restart_backoff_max_s"])
        assert up.proc.poll() is None
        assert up.count(r"^\[w1\] started") == POLICY["max_crashes"]
        for i in range(4):
            assert status_of(router, f"without w1 {i}") == 200
        pids = all_pids(up, ["w0", "w1", "router"])
        assert up.stop(signal.SIGTERM) == 1  # a child was given up on
        assert not any(alive(pid) for pid in pids)
    finally:
        up.stop(signal.SIGKILL)
