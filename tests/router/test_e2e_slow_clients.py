"""Clients that stop reading, end to end: a router process in front of a demo worker.

A streaming client that never reads blocks the router's writes to it. Past
``proxy.client_write_timeout_s`` the router ends that request (closed by the client),
closes the worker's stream and releases its in-flight count, so such clients cannot
make the worker look saturated to everyone else.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from harness.procs import start_router, start_worker
from router.front.auth import hash_key

pytestmark = pytest.mark.slow
ALICE, BOB = "key-alice", "key-bob"
NUM_STALLED = 6


def router_config(worker_url: str) -> str:
    lines = ["[registry]", "poll_interval_s = 0.2", "[proxy]", "client_write_timeout_s = 1.0",
             "[models.demo]", 'tokenizer = "demo"']
    for tenant, key in (("alice", ALICE), ("bob", BOB)):
        lines += [f"[auth.tenants.{tenant}]", f'key_digests = ["{hash_key(key)}"]']
    lines += ["[[workers]]", 'id = "w0"', 'model = "demo"', f'url = "{worker_url}"']
    return "\n".join(lines) + "\n"


def stalled_stream(url: str, key: str) -> socket.socket:
    """A streaming request on a socket with a tiny receive buffer that is never read."""
    parts = urllib.parse.urlsplit(url)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    sock.connect((parts.hostname, parts.port))
    body = json.dumps({"model": "demo", "prompt": "hello", "max_tokens": 3500,
                       "stream": True}).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                 b"\r\nAuthorization: Bearer " + key.encode() + b"\r\nContent-Length: "
                 + str(len(body)).encode() + b"\r\n\r\n" + body)
    return sock


def status_of(url: str, key: str) -> int:
    request = urllib.request.Request(
        f"{url}/v1/completions", method="POST", headers={
            "Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        data=json.dumps({"model": "demo", "prompt": "hi", "max_tokens": 2}).encode())
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_clients_that_never_read_do_not_lock_other_tenants_out(tmp_path: Path) -> None:
    worker = start_worker("--max-num-seqs", "2", "--max-waiting-requests", "2",
                          kv_cache_bytes="32MiB")
    router = None
    try:
        path = tmp_path / "router.toml"
        path.write_text(router_config(worker.url))
        router = start_router(path)
        deadline = time.monotonic() + 60
        while status_of(router.url, BOB) != 200:
            assert time.monotonic() < deadline, "the router never served"
            time.sleep(0.2)
        stalled = [stalled_stream(router.url, ALICE) for _ in range(NUM_STALLED)]
        time.sleep(3.0)  # past the write timeout: the stalled requests have ended
        statuses = [status_of(router.url, BOB) for _ in range(5)]
        assert statuses == [200] * 5, statuses
        for sock in stalled:
            sock.close()
    finally:
        if router is not None:
            router.stop()
            assert "Traceback" not in router.log_text()
        worker.stop()
