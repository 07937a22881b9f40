"""Clients that stop reading, end to end: a router process in front of a demo worker.

A streaming client that never reads blocks the router's writes to it. Past
``proxy.client_write_timeout_s`` the router ends that request (closed by the client),
closes the worker's stream and releases its in-flight count, so such clients cannot
make the worker look saturated to everyone else.
"""

from __future__ import annotations

import json
import socket
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from harness.procs import start_process, start_router, start_worker
from tests.support.polling import wait_until
from tests.support.router_calls import complete
from tests.support.router_configs import ALICE, BOB, auth_section, model_table, to_toml, worker_list

pytestmark = pytest.mark.slow
NUM_STALLED = 6


def router_config(worker_url: str, client_write_timeout_s: float = 1.0) -> str:
    return to_toml({"registry": {"poll_interval_s": 0.2},
                    "proxy": {"client_write_timeout_s": client_write_timeout_s},
                    "models": {"demo": model_table()},
                    "auth": auth_section({"alice": {}, "bob": {}}, admin=False),
                    "workers": worker_list({"w0": worker_url})})


def status_of(url: str, key: str) -> int:
    """The status of a short completion (the model may stop early) for ``key``."""
    return complete(url, "hi", key, full_length=False, timeout_s=30)[0]


def stalled_stream(url: str, key: str, max_tokens: int = 3500, receive_buffer: int = 1024
                   ) -> socket.socket:
    """A streaming request on a socket with a small receive buffer, not yet read."""
    parts = urllib.parse.urlsplit(url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.connect((parts.hostname, parts.port))
    body = json.dumps({"model": "demo", "prompt": "hello", "max_tokens": max_tokens,
                       "stream": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nAuthorization: Bearer " + key.encode() + b"\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    return sock


def test_clients_that_never_read_do_not_lock_other_tenants_out(tmp_path: Path) -> None:
    worker = start_worker("--max-num-seqs", "2", "--max-waiting-requests", "2",
                          kv_cache_bytes="32MiB")
    router = None
    try:
        path = tmp_path / "router.toml"
        path.write_text(router_config(worker.url))
        router = start_router(path)
        wait_until(lambda: status_of(router.url, BOB) == 200, 60, "the router to serve",
                   interval_s=0.2)
        stalled = [stalled_stream(router.url, ALICE) for _ in range(NUM_STALLED)]
        # Six stalled requests for a worker that holds four (two running, two waiting)
        # do not all end at once: each ends once the 1 s write timeout passes after its
        # writes block, so another tenant may get one answer between them (a fixed 3 s
        # sleep, then five answers, failed in CI). Within 12 s five answers in a row
        # must succeed. The clients never read, so a router that did not end their
        # requests would hold them, and fail this, forever.
        five_in_a_row = [200] * 5
        wait_until(lambda: [status_of(router.url, BOB) for _ in range(5)] == five_in_a_row,
                   12, "five answers in a row for another tenant", interval_s=0.5)
        for sock in stalled:
            sock.close()
    finally:
        if router is not None:
            router.stop()
            assert "Traceback" not in router.log_text()
        worker.stop()


def test_a_client_that_reads_too_slowly_is_cut_off_once_its_write_budget_is_spent(
        tmp_path: Path) -> None:
    """The client reads 64 KiB every 0.1 s: each wait for its connection to take more
    (about 2 s: the kernel holds 4 MB for it and wakes the writer once a third is free)
    is under ``client_write_timeout_s`` (5 s), but together the waits pass it, and the
    router drops the connection long before the 150,000-token stream (about 25 MB, 40 s
    at that pace) is through. The client then reads what the kernel still holds for it
    and the end of the connection, without ``[DONE]``."""
    upstream = start_process([sys.executable, "-m", "harness.instant_upstream"])
    router = None
    try:
        path = tmp_path / "router.toml"
        path.write_text(router_config(upstream.url, client_write_timeout_s=5.0))
        router = start_router(path)
        wait_until(lambda: status_of(router.url, BOB) == 200, 60, "the router to serve",
                   interval_s=0.2)
        sock = stalled_stream(router.url, ALICE, max_tokens=150_000, receive_buffer=131072)
        received = b""
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline:
            time.sleep(0.1)
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
        else:
            pytest.fail(f"still streaming after 25 s ({len(received)} bytes read)")
        sock.close()
        assert b"[DONE]" not in received
    finally:
        if router is not None:
            router.stop()
            assert "Traceback" not in router.log_text()
        upstream.stop()
