"""The chaos soak's clients: greedy requests whose every outcome is classified, and
the hostile clients (non-reading streams, slowloris, clients that hang up).

A request is sent to one router and ends as exactly one ``Outcome``:

- ``ok``: answered in full (a stream ended with ``[DONE]``) with the text of the
  fault-free reference run;
- ``mismatch``: answered in full but with another text (a resume that lost or
  repeated text): lost;
- ``error``: a clean error, an HTTP error with a JSON body or a stream that ends with
  an error event (``status`` keeps the code; 5xx are counted);
- ``refused``: the connection was refused (the router was down: nothing was sent);
- ``dropped``: the connection closed before any response came (a router shutting
  down closed the idle keep-alive connection the request went out on; the client
  cannot tell whether it ran, and HTTP clients retry these);
- ``lost``: anything else: a reset or truncated answer, a timeout, an unparsable body.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

from harness.sse import data_payloads

MAX_TOKENS = 16
REQUEST_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class Request:
    """One greedy request: ``chat`` or completions, ``prompt_index`` into the prompts."""

    tenant_key: str
    chat: bool
    prompt: str
    stream: bool

    def body(self) -> dict[str, object]:
        body: dict[str, object] = {"model": "demo", "max_tokens": MAX_TOKENS, "temperature": 0,
                                   "ignore_eos": True, "stream": self.stream}
        if self.chat:
            body["messages"] = [{"role": "user", "content": self.prompt}]
        else:
            body["prompt"] = self.prompt
        return body

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.chat else "/v1/completions"

    @property
    def reference_key(self) -> tuple[bool, str]:
        """Streaming and not give the same text: the reference ignores ``stream``."""
        return self.chat, self.prompt


@dataclass(frozen=True)
class Outcome:
    """How one request ended, when it started (monotonic) and how long it took."""

    kind: str  # ok, mismatch, error, refused, dropped, lost
    status: int | None
    started: float
    latency_s: float
    detail: str = ""


def _choice_text(choice: dict, chat: bool, stream: bool) -> str:
    if not chat:
        return choice.get("text") or ""
    part = choice.get("delta" if stream else "message") or {}
    return part.get("content") or ""


async def _read_stream(response: aiohttp.ClientResponse, chat: bool) -> tuple[str, str | None, bool]:
    """(text, error message or None, whether ``[DONE]`` came)."""
    text: list[str] = []
    async for data in data_payloads(response.content):
        if data == "[DONE]":
            return "".join(text), None, True
        event = json.loads(data)
        if "error" in event:
            return "".join(text), str(event["error"]), False
        for choice in event.get("choices", []):
            text.append(_choice_text(choice, chat, True))
    return "".join(text), None, False


async def send(session: aiohttp.ClientSession, router: str, request: Request,
               reference: str | None) -> Outcome:
    """Send ``request`` to ``router`` and classify the answer against ``reference``
    (None: no reference yet, any full answer is ``ok``; its text is the detail)."""
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {request.tenant_key}"}

    def outcome(kind: str, status: int | None, detail: str = "") -> Outcome:
        return Outcome(kind, status, started, time.monotonic() - started, detail)

    answered = False
    try:
        async with session.post(router + request.path, json=request.body(), headers=headers,
                                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
                                ) as response:
            answered = True
            if response.status != 200:
                body = await response.json(content_type=None)
                return outcome("error" if "error" in body else "lost", response.status)
            if request.stream:
                text, error, done = await _read_stream(response, request.chat)
                if error is not None:
                    return outcome("error", 200, error)
                if not done:
                    return outcome("lost", 200, "stream ended without [DONE]")
            else:
                body = await response.json()
                text = _choice_text(body["choices"][0], request.chat, False)
    except aiohttp.ClientConnectorError as exc:
        return outcome("refused", None, str(exc))
    except aiohttp.ClientError as exc:
        return outcome("lost" if answered else "dropped", None, f"{type(exc).__name__}: {exc}")
    except (TimeoutError, ValueError, KeyError) as exc:
        return outcome("lost", None, f"{type(exc).__name__}: {exc}")
    if reference is not None and text != reference:
        return outcome("mismatch", 200, f"{text!r} != {reference!r}")
    return outcome("ok", 200, text)


def _open(router: str, rcvbuf: int | None = None) -> socket.socket:
    host, port = router.removeprefix("http://").rsplit(":", 1)
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(5)
    sock.connect((host, int(port)))
    sock.setblocking(False)
    return sock


def open_non_reading(router: str, tenant_key: str, count: int) -> list[socket.socket]:
    """``count`` streaming requests with the longest output a tenant may ask for, each
    on a socket with a tiny receive buffer that is never read."""
    body = json.dumps({"model": "demo", "prompt": "never read " * 20, "max_tokens": 512,
                       "ignore_eos": True, "stream": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: chaos\r\nAuthorization: Bearer "
            f"{tenant_key}\r\nContent-Type: application/json\r\nContent-Length: "
            f"{len(body)}\r\n\r\n").encode()
    sockets = []
    for _ in range(count):
        sock = _open(router, rcvbuf=1024)
        sock.sendall(head + body)
        sockets.append(sock)
    return sockets


class Slowloris:
    """``count`` sockets that send a request's headers one byte every ``interval_s``."""

    HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: chaos\r\nX-Slow: " + b"a" * 4096

    def __init__(self, router: str, count: int, interval_s: float = 1.0) -> None:
        self.sockets = [_open(router) for _ in range(count)]
        self._sent = 0
        self._interval_s = interval_s
        self.num_closed_by_server = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Trickle until ``stop``; count the sockets the server closed meanwhile."""
        while not stop.is_set() and self._sent < len(self.HEAD):
            byte = self.HEAD[self._sent:self._sent + 1]
            for sock in list(self.sockets):
                try:
                    if _closed_by_peer(sock):
                        raise ConnectionResetError
                    sock.send(byte)
                except OSError:
                    self.sockets.remove(sock)
                    self.num_closed_by_server += 1
            self._sent += 1
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self._interval_s)

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the other end closed ``sock`` (an end of stream or a reset is waiting);
    never blocks."""
    try:
        return sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False


def close_all(sockets: Sequence[socket.socket]) -> None:
    for sock in sockets:
        sock.close()


# Where a client that hangs up closes its connection: right after sending its request,
# after a random delay of up to HANG_UP_MAX_DELAY_S (in a PD fleet: during the prefill
# leg, the pull or the decode's queueing; before the first byte), or once the first
# event of its stream came (mid-stream).
HANG_UP_POINTS = ("after_send", "delayed", "mid_stream")
HANG_UP_MAX_DELAY_S = 0.5
HANG_UP_TIMEOUT_S = 10.0


async def hang_up(router: str, tenant_key: str, prompt: str, point: str,
                  rng: random.Random) -> bool:
    """Send a completion of ``prompt`` to ``router`` and close the connection at
    ``point`` (``HANG_UP_POINTS``), half the time with a reset rather than a FIN;
    whether any byte of the answer came first. At most ``HANG_UP_TIMEOUT_S``."""
    host, port = router.removeprefix("http://").rsplit(":", 1)
    body = json.dumps({"model": "demo", "prompt": prompt, "max_tokens": 64, "temperature": 0,
                       "ignore_eos": True, "stream": point == "mid_stream"}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: chaos\r\nAuthorization: Bearer "
            f"{tenant_key}\r\nContent-Type: application/json\r\nContent-Length: "
            f"{len(body)}\r\n\r\n").encode()
    received = b""
    writer = None
    with contextlib.suppress(TimeoutError, OSError):
        async with asyncio.timeout(HANG_UP_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(head + body)
            await writer.drain()
            if point == "delayed":
                await asyncio.sleep(rng.uniform(0.0, HANG_UP_MAX_DELAY_S))
            elif point == "mid_stream":
                while b"data:" not in received and len(received) < 65536:
                    chunk = await reader.read(4096)
                    if not chunk:
                        break
                    received += chunk
    if writer is not None:
        if rng.random() < 0.5:
            writer.transport.abort()
        else:
            writer.close()
    return bool(received)
