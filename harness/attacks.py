"""Hostile clients of a router, and what to watch while they run.

Each attack is a plain function on raw sockets to a loopback router, bounded in the
bytes it sends and the seconds it takes, that returns the status line the router
answered (``b""`` when it closed without one). They are the reproductions of the
audit behind docs/security.md's "Hostile input" section: a header that never ends,
a header name that never ends, a token-id body far past a tenant's limits (or a
model's context), a large body on a route the lean server hands to aiohttp, and a
chunked body whose trailer or chunk extension never ends. ``HealthWatch`` times
``GET /health`` from another client while they run; ``rss_bytes`` reads a process's
resident memory from ``/proc``. The hostile suite (tests/router/test_e2e_hostile.py)
and the chaos soak (``bench.chaos_faults``) use both. ``oversized_transfer_header``
and ``unsigned_transfer_request`` attack a worker's KV transfer port instead (docs/pd.md)
and return the header of the refusal frame it answered (None: none).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import select
import socket
import statistics
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from workers.kv_transfer.wire import FRAME, MAC_BYTES

CHUNK = 64 * 1024
# A prompt of token ids, about 5 bytes per id: "[1000, 1000, ...]".
_TOKEN_IDS = b"1000, " * (CHUNK // 6)


def _connect(url: str, timeout_s: float) -> socket.socket:
    parts = urllib.parse.urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout_s)
    sock.settimeout(timeout_s)
    return sock


def _answer(sock: socket.socket) -> bytes:
    """The status line the peer sent (``b""`` if it closed without one, or went quiet
    past the socket's timeout)."""
    received = b""
    with contextlib.suppress(OSError):
        while b"\r\n" not in received and len(received) < 4096:
            chunk = sock.recv(4096)
            if not chunk:
                break
            received += chunk
    return received.split(b"\r\n", 1)[0] if b"\r\n" in received else b""


def _send_until_answered(sock: socket.socket, head: bytes, filler: bytes, max_bytes: int
                         ) -> bytes:
    """Send ``head``, then ``filler`` over and over up to ``max_bytes`` in all or until
    the router answers or closes; the router's status line."""
    sent = 0
    try:
        sock.sendall(head)
        while sent < max_bytes:
            sock.sendall(filler)
            sent += len(filler)
            if _peer_spoke(sock):
                break
    except OSError:
        pass  # the router closed: its answer may be waiting all the same
    return _answer(sock)


def _peer_spoke(sock: socket.socket) -> bool:
    """Whether bytes or an end of stream from the router are waiting; never blocks."""
    return bool(select.select([sock], [], [], 0)[0])


def unterminated_header(url: str, max_bytes: int = 16 << 20, timeout_s: float = 20.0
                        ) -> bytes:
    """``GET /health`` with a header value that never ends (no CRLF), sent up to
    ``max_bytes``: the router should answer 431 once the head passes its limit."""
    with _connect(url, timeout_s) as sock:
        return _send_until_answered(sock, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ",
                                    b"a" * CHUNK, max_bytes)


def unterminated_header_name(url: str, max_bytes: int = 16 << 20, timeout_s: float = 20.0
                             ) -> bytes:
    """``GET /health`` with a header name that never ends (no colon, no CRLF)."""
    with _connect(url, timeout_s) as sock:
        return _send_until_answered(sock, b"GET /health HTTP/1.1\r\nHost: x\r\n",
                                    b"X" * CHUNK, max_bytes)


def oversize_token_prompt(url: str, api_key: str, num_bytes: int = 32 << 20,
                          chunked: bool = False, timeout_s: float = 20.0) -> bytes:
    """``POST /v1/completions`` whose prompt is ``num_bytes`` of token ids, announced
    by Content-Length (or chunked, so only the bytes tell): the router should refuse
    it (413) before it reads, let alone decodes, the body."""
    length = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: %d" % num_bytes
    start, filler = b'{"model": "demo", "prompt": [', _TOKEN_IDS
    if chunked:
        start, filler = _chunk(start), _chunk(filler)
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + api_key.encode() + b"\r\n" + length + b"\r\n\r\n"
            + start)
    with _connect(url, timeout_s) as sock:
        return _send_until_answered(sock, head, filler, num_bytes)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%b\r\n" % (len(data), data)


def oversize_handed_off_body(url: str, num_bytes: int = 31 << 20, timeout_s: float = 20.0
                             ) -> bytes:
    """``GET /health`` (a route the lean server hands to aiohttp) with a ``num_bytes``
    body: the router should answer without holding the body first."""
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % num_bytes
    with _connect(url, timeout_s) as sock:
        return _send_until_answered(sock, head, b"x" * CHUNK, num_bytes)


def endless_trailer(url: str, api_key: str | None = None, max_bytes: int = 16 << 20,
                    timeout_s: float = 20.0) -> bytes:
    """A chunked body's last chunk (``0``), then a trailer field that never ends, sent up
    to ``max_bytes`` or until the router ends the connection. Without ``api_key`` on
    ``GET /health`` (aiohttp answers it at once, the trailer keeps coming), with it on
    ``POST /v1/completions`` (the answer waits for the body). The router should stop
    reading once the body's framing passes its budget: the status line it answered
    once it ended the connection (``b""`` when it never did)."""
    key = b"" if api_key is None else b"Authorization: Bearer " + api_key.encode() + b"\r\n"
    request = b"GET /health" if api_key is None else b"POST /v1/completions"
    head = (request + b" HTTP/1.1\r\nHost: x\r\n" + key
            + b"Transfer-Encoding: chunked\r\n\r\n0\r\nX-Trailer: ")
    with _connect(url, timeout_s) as sock:
        return _send_until_closed(sock, head, b"a" * CHUNK, max_bytes)


def endless_chunk_extension(url: str, api_key: str, max_bytes: int = 16 << 20,
                            timeout_s: float = 20.0) -> bytes:
    """``POST /v1/completions`` whose first chunk-size line carries an extension that
    never ends (``1;x=aaaa...``): no payload ever comes. The router should refuse it
    (400) once the body's framing passes its budget; the status line and the end of
    the connection, as ``endless_trailer``."""
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + api_key.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n1;x=")
    with _connect(url, timeout_s) as sock:
        return _send_until_closed(sock, head, b"a" * CHUNK, max_bytes)


def _send_until_closed(sock: socket.socket, head: bytes, filler: bytes, max_bytes: int
                       ) -> bytes:
    """Send ``head``, then ``filler`` over and over up to ``max_bytes`` in all, reading
    what the router sends meanwhile; its status line once it ended the connection,
    ``b""`` if it had not after ``max_bytes`` (or went quiet past the timeout)."""
    received, sent = b"", 0
    try:
        sock.sendall(head)
        while sent < max_bytes:
            sock.sendall(filler)
            sent += len(filler)
            while _peer_spoke(sock):
                data = sock.recv(4096)
                if not data:
                    return received.split(b"\r\n", 1)[0]
                received = (received + data)[:4096]
    except OSError:  # reset by the router: it ended the connection
        return received.split(b"\r\n", 1)[0] if received else _answer(sock)
    return b""


def status_code(status_line: bytes) -> int | None:
    """The code of an ``HTTP/1.1 431 ...`` status line; None for none."""
    parts = status_line.split(b" ", 2)
    return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else None


def rss_bytes(pid: int, field: str = "VmRSS") -> int:
    """The resident memory of process ``pid`` now (``VmRSS`` in ``/proc/PID/status``),
    or its peak so far with ``field="VmHWM"``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"no {field} for process {pid}")


class HealthWatch:
    """``GET /health`` on its own connection every ``interval_s`` in a thread, from
    ``start`` to ``stop``: the latency of each (a failed or refused call counts as
    ``timeout_s``) and how many failed (no 200 within ``timeout_s``)."""

    def __init__(self, url: str, interval_s: float = 0.05, timeout_s: float = 10.0) -> None:
        self._url = url
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.latencies_s: list[float] = []
        self.num_failed = 0

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                with _connect(self._url, self._timeout_s) as sock:
                    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    ok = status_code(_answer(sock)) == 200
            except OSError:
                ok = False
            self.num_failed += not ok
            self.latencies_s.append(time.monotonic() - started if ok else self._timeout_s)
            self._stop.wait(self._interval_s)

    @contextlib.contextmanager
    def running(self) -> Iterator[HealthWatch]:
        """Watch while the ``with`` block runs."""
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(self._timeout_s + 1)

    def median_s(self) -> float:
        """The median latency (infinite before any call ended)."""
        return statistics.median(self.latencies_s) if self.latencies_s else float("inf")

    def summary(self) -> str:
        """Count, median and worst, for an assertion message or a report."""
        worst = max(self.latencies_s, default=float("inf"))
        return (f"{len(self.latencies_s)} calls ({self.num_failed} failed), median "
                f"{self.median_s() * 1000:.0f} ms, worst {worst * 1000:.0f} ms")


# ---- the KV transfer port (docs/pd.md, "The transfer") ------------------------------

def _transfer_refusal(sock: socket.socket) -> dict | None:
    """The header of the one frame a transfer port answered (read without checking its
    MAC: an attacker's view), or None when it closed or went quiet without one."""
    received = b""
    with contextlib.suppress(OSError):
        while len(received) < 64 * 1024:
            head = FRAME.size + MAC_BYTES
            if len(received) >= head:
                header_len = FRAME.unpack(received[: FRAME.size])[0]
                if len(received) >= head + header_len:
                    return json.loads(received[head: head + header_len])
            chunk = sock.recv(4096)
            if not chunk:
                break
            received += chunk
    return None


def oversized_transfer_header(host: str, port: int, header_len: int = 1 << 20,
                              timeout_s: float = 5.0) -> dict | None:
    """Claim a pull header of ``header_len`` bytes (past any pull's bound, under the
    16 MiB a port once buffered) and send only its first 64 KiB, unsigned. A port that
    bounds before it buffers refuses at the lengths: its refusal frame's header
    (``{"ok": false, "error": "oversized", ...}``); None when it answered nothing within
    ``timeout_s`` (it waited for the rest)."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        with contextlib.suppress(OSError):  # it may close while we still send
            sock.sendall(FRAME.pack(header_len, 0) + bytes(MAC_BYTES) + b"{" * CHUNK)
        return _transfer_refusal(sock)


def unsigned_transfer_request(host: str, port: int, timeout_s: float = 5.0) -> dict | None:
    """A frame of the transfer's layout whose header is not even JSON, under a MAC made
    without the key. A port that authenticates before it parses refuses it as
    ``unauthenticated`` (never ``protocol``, which would mean it parsed first): its
    refusal frame's header; None when it answered nothing within ``timeout_s``."""
    header = b"{" * 200
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(FRAME.pack(len(header), 0) + secrets.token_bytes(MAC_BYTES) + header)
        return _transfer_refusal(sock)
