"""HTTP/1.1 conformance of a real router process (``router.server.http1`` in front,
aiohttp behind it), over raw sockets: pipelined requests answered in order, chunked
request bodies, ``Expect: 100-continue``, oversize and malformed requests refused
with 400/413/414/431 (never a 500) and the connection closed after them, a smuggling
attempt answered once, and streamed answers framed as chunks."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import sys
from collections.abc import Iterator

import pytest

from harness.procs import ManagedProcess, http_json, start_process, start_router
from tests.support.router_calls import num_ready_workers
from tests.support.router_configs import (
    ADMIN,
    ALICE,
    auth_section,
    model_table,
    to_toml,
    worker_list,
)

# Its module-scoped processes start once: the whole module runs on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("http_conformance")]
KEY = ALICE
BODY = json.dumps({"model": "demo", "prompt": "hello world", "max_tokens": 2}).encode()


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    upstream = start_process([sys.executable, "-m", "harness.instant_upstream"])
    path = tmp_path_factory.mktemp("router") / "router.toml"
    path.write_text(to_toml({"models": {"demo": model_table()},
                             "listen": {"keepalive_timeout_s": 2.0, "body_timeout_s": 2.0},
                             "auth": auth_section({"alice": {}}),
                             "workers": worker_list({"u0": upstream.url})}))
    process = start_router(path)
    try:
        for _ in range(100):
            if num_ready_workers(process) == 1:
                break
        yield process
    finally:
        process.stop()
        upstream.stop()


def post(body: bytes = BODY, path: str = "/v1/completions", extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
            ).encode() + body


def exchange(router: ManagedProcess, data: bytes, then: bytes | None = None,
             timeout_s: float = 5.0) -> bytes:
    """Send ``data`` (and ``then`` once the router answered something), read until the
    router closes the connection or goes quiet for ``timeout_s``."""
    host, port = router.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.settimeout(timeout_s)
        sock.sendall(data)
        received = b""
        try:
            if then is not None:
                received = sock.recv(65536)
                sock.sendall(then)
            while chunk := sock.recv(65536):
                received += chunk
        except TimeoutError:
            received += b"<quiet>"
        return received


def statuses(answer: bytes) -> list[int]:
    return [int(status) for status in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)]


def test_pipelined_requests_are_answered_in_order(router) -> None:
    close = "Connection: close\r\n"
    answer = exchange(router, post(extra="X-Request-Id: first\r\n")
                      + post(b"{", extra="X-Request-Id: second\r\n")
                      + b"GET /health HTTP/1.1\r\nHost: x\r\nX-Request-Id: third\r\n\r\n"
                      + post(extra=f"X-Request-Id: fourth\r\n{close}"))
    assert statuses(answer) == [200, 400, 200, 200], answer
    ids = re.findall(rb"(?i)x-request-id: ([a-z]+)\r\n", answer)
    assert ids == [b"first", b"second", b"third", b"fourth"]
    assert not answer.endswith(b"<quiet>")


def test_a_chunked_request_body_is_read(router) -> None:
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n").encode()
    chunks = b"".join(b"%x\r\n%b\r\n" % (len(BODY[i:i + 7]), BODY[i:i + 7])
                      for i in range(0, len(BODY), 7))
    answer = exchange(router, head + chunks + b"0\r\n\r\n")
    assert statuses(answer) == [200] and b'"choices"' in answer, answer


def test_expect_100_continue_is_answered_before_the_body(router) -> None:
    request = post(extra="Expect: 100-continue\r\nConnection: close\r\n")
    head, body = request.split(b"\r\n\r\n", 1)
    answer = exchange(router, head + b"\r\n\r\n", then=body)
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), answer
    assert statuses(answer) == [100, 200], answer


def test_a_stream_is_chunked_and_ends_with_the_last_chunk(router) -> None:
    body = json.dumps({"model": "demo", "prompt": "hi", "max_tokens": 3, "stream": True})
    answer = exchange(router, post(body.encode(), extra="Connection: close\r\n"))
    assert statuses(answer) == [200] and b"Transfer-Encoding: chunked" in answer
    assert b"data: [DONE]" in answer and answer.endswith(b"0\r\n\r\n"), answer


@pytest.mark.parametrize(("request_bytes", "status"), [
    (post(b"x" * 10, extra="X-Big: 1\r\n").replace(b"Content-Length: 10", b"Content-Length: "
                                                    + str(2**30).encode()), 413),
    (post(extra="X-Big: " + "a" * 70_000 + "\r\n"), 431),
    (post(extra="".join(f"X-{i}: {i}\r\n" for i in range(150))), 431),
    (b"POST /v1/completions?" + b"q" * 10_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
    (b"\x16\x03\x01 not http at all\r\n\r\n", 400),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
     + b"\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", 400),
    (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n"
     b"\r\nab", 400),
])
def test_oversize_and_malformed_requests_are_refused_and_closed(router, request_bytes,
                                                                status) -> None:
    answer = exchange(router, request_bytes + post())
    assert statuses(answer) == [status], answer
    assert b"Connection: close" in answer and not answer.endswith(b"<quiet>")
    assert http_json("GET", f"{router.url}/health")[0] == 200


def test_an_oversize_body_for_an_aiohttp_route_meets_its_handler_unbuffered(router) -> None:
    """A route handed to aiohttp gets its body streamed, so its handler refuses the
    request (here: no admin key) before the 33 MiB are read, not after."""
    head = (b"POST /admin/workers HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"%x\r\n" % (33 * 2**20))
    answer = exchange(router, head + b"x" * (33 * 2**20))
    assert statuses(answer) == [401] and not answer.endswith(b"<quiet>"), answer[:300]


@pytest.mark.parametrize("start", [b"X-Big: ", b"X-" + b"n" * 100])
def test_a_header_that_never_ends_is_refused_once_past_the_head_limit(router, start) -> None:
    """llhttp reports a header only once it ends; the bytes are counted as they come."""
    with socket.create_connection((router.url.removeprefix("http://").split(":")[0],
                                   int(router.url.rsplit(":", 1)[1])), timeout=10) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + start)
        answer = b""
        with contextlib.suppress(OSError):
            for _ in range(64):  # 64 x 64 KiB, far past the limit: a refusal comes first
                sock.sendall(b"y" * 65536)
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
    assert statuses(answer) == [431], answer[:200]
    assert http_json("GET", f"{router.url}/health")[0] == 200


def test_a_trailer_never_becomes_a_header(router) -> None:
    """The admin key sent only in a chunked body's trailer does not authenticate."""
    request = (b"GET /admin/workers HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
               b"\r\n0\r\nAuthorization: Bearer " + ADMIN.encode() + b"\r\n\r\n")
    assert statuses(exchange(router, request))[0] == 401
    with_key = (b"GET /admin/workers HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                + ADMIN.encode() + b"\r\nContent-Length: 0\r\n\r\n")
    assert statuses(exchange(router, with_key))[0] == 200


def test_a_smuggled_request_is_never_answered(router) -> None:
    hidden = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
    smuggle = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + hidden + b"\r\n\r\n")
    answer = exchange(router, smuggle)
    assert statuses(answer) == [400] and b'"object"' not in answer, answer
    # The same bytes after a valid keep-alive request: one answer each, no third.
    answer = exchange(router, post() + smuggle)
    assert statuses(answer) == [200, 400], answer


def test_an_unread_request_body_closes_the_connection(router) -> None:
    unauthorized = post().replace(f"Bearer {KEY}".encode(), b"Bearer wrong")
    answer = exchange(router, unauthorized[:-4], then=None, timeout_s=3.0)
    assert statuses(answer) == [401] and b"Connection: close" in answer, answer
    assert not answer.endswith(b"<quiet>")
