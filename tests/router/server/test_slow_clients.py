"""Slowloris against a real router process: a connection that trickles its request
head is closed once ``listen.keepalive_timeout_s`` has passed, and a request that
trickles its body gets a 408 after ``listen.body_timeout_s``; the router keeps
serving meanwhile."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from harness.procs import ManagedProcess, http_json, start_router
from tests.support.router_configs import auth_section, model_table, to_toml

# Its module-scoped processes start once: the whole module runs on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("slow_clients")]
TIMEOUT_S = 1.0
TRICKLE_S = 0.1


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    path = tmp_path_factory.mktemp("router") / "router.toml"
    path.write_text(to_toml({"models": {"demo": model_table()},
                             "listen": {"keepalive_timeout_s": TIMEOUT_S,
                                        "body_timeout_s": TIMEOUT_S},
                             "auth": auth_section({"alice": {}}, admin=False)}))
    process = start_router(path)
    yield process
    process.stop()


def trickle(router: ManagedProcess, head: bytes, then: bytes, limit_s: float
            ) -> tuple[float, bytes]:
    """Send ``head``, then ``then`` one byte every TRICKLE_S until the router answers
    or closes (or ``limit_s``); (seconds until then, what it sent back)."""
    host, port = router.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.settimeout(TRICKLE_S)
        started = time.monotonic()
        sock.sendall(head)
        for i in range(int(limit_s / TRICKLE_S)):
            try:
                sock.sendall(then[i % len(then): i % len(then) + 1])
                if answer := sock.recv(65536):
                    return time.monotonic() - started, answer
                return time.monotonic() - started, b""   # closed
            except TimeoutError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - started, b""
        return time.monotonic() - started, b"still open"


def test_a_trickled_request_head_is_cut_off(router) -> None:
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
    elapsed, answer = trickle(router, head, b"X-Slow: aaaaaaaa\r\n", limit_s=10 * TIMEOUT_S)
    assert answer == b"" and TIMEOUT_S * 0.9 < elapsed < TIMEOUT_S + 1.0, (elapsed, answer)
    assert http_json("GET", f"{router.url}/health")[0] == 200


def test_a_trickled_body_is_a_408(router) -> None:
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-alice\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
    elapsed, answer = trickle(router, head, b" ", limit_s=10 * TIMEOUT_S)
    assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer, answer
    assert TIMEOUT_S * 0.9 < elapsed < TIMEOUT_S + 1.0, elapsed
