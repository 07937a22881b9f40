"""``Client`` over one request of the lean HTTP/1.1 server (``router.server.http1``).

Answers are framed here: a whole answer with ``Content-Length``, a stream with
``Transfer-Encoding: chunked`` (HTTP/1.0: no framing, the connection closes after
it). Every answer carries ``X-Request-Id``, and ``Connection: close`` when the
connection closes after it. ``write`` waits while the client's socket buffer is over
its high-water mark (``Http1Connection.drain``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from http import HTTPStatus
from typing import Protocol

from radix.api_errors import ApiError
from router.client import SSE_HEADERS, Client
from router.server.http1_requests import Message
from router.server.request_ids import HEADER, VALID_ID

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_END_CHUNKS = b"0\r\n\r\n"


def head(status: int, headers: Mapping[str, str], request_id: str, close: bool) -> bytes:
    """A response's status line and headers, blank line included."""
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:
        reason = "Unknown"
    lines = [f"HTTP/1.1 {status} {reason}", f"{HEADER}: {request_id}"]
    lines += [f"{name}: {value}" for name, value in headers.items()
              if name.lower() != "connection"]
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class Connection(Protocol):
    """What a client needs of its connection (``router.server.http1.Http1Connection``)."""

    lost: bool

    @property
    def write_paused(self) -> bool:
        """The transport's buffer is over its high-water mark."""

    def send(self, data: bytes) -> None:
        """Write ``data`` to the transport (dropped once the connection is lost)."""

    async def drain(self) -> None:
        """Return once the transport's buffer is below its low-water mark again."""

    def send_continue(self, message: Message) -> None:
        """``100 Continue`` when ``message`` asked for it and nothing was sent yet."""

    def release_body(self) -> None:
        """Read the socket again if it paused for a body whose bound was not known."""

    def closes_after(self, message: Message) -> bool:
        """The connection closes after the answer to ``message``."""

    def close_after_answer(self) -> None:
        """Close the connection once the current answer is sent."""

    def abort(self) -> None:
        """Drop the connection at once."""


class Http1Client(Client):
    """One request (``message``) of ``connection``; see ``Client`` for the contract."""

    def __init__(self, connection: Connection, message: Message) -> None:
        self._connection = connection
        self._message = message
        given = message.headers.get(b"x-request-id", b"").decode("latin-1")
        self.request_id = given if VALID_ID.fullmatch(given) else os.urandom(16).hex()
        self._started = False
        self._answered = False
        self._chunked = message.version != "1.0"

    def header(self, name: str) -> str | None:
        value = self._message.headers.get(name.lower().encode("latin-1"))
        return None if value is None else value.decode("latin-1")

    async def read_body(self, timeout_s: float, max_bytes: int) -> bytes:
        message = self._message
        message.limit_body(max_bytes)
        self._connection.release_body()
        if message.body.done():  # the common case: no timer, no waiting
            return message.body.result()
        self._connection.send_continue(message)
        try:
            async with asyncio.timeout(timeout_s):
                return await asyncio.shield(message.body)
        except TimeoutError:
            raise ApiError(408, f"request body not received within {timeout_s:g} s",
                           code="request_timeout", headers={"Connection": "close"}) from None

    @property
    def started(self) -> bool:
        return self._started

    @property
    def answered(self) -> bool:
        """An answer (whole or a stream's head) has been sent."""
        return self._answered

    async def start_stream(self) -> None:
        headers = dict(SSE_HEADERS)
        close = self._connection.closes_after(self._message) or not self._chunked
        if self._chunked:
            headers["Transfer-Encoding"] = "chunked"
        self._started = self._answered = True
        self._connection.send(head(200, headers, self.request_id, close))

    async def write(self, data: bytes, timeout_s: float) -> None:
        connection = self._connection
        if connection.lost:
            raise ConnectionResetError("the client went away")
        if self._chunked:
            data = b"%x\r\n%b\r\n" % (len(data), data)
        connection.send(data)
        if connection.write_paused:  # only then a timer: most writes never wait
            async with asyncio.timeout(timeout_s):
                await connection.drain()

    def end_stream(self) -> None:
        """The last chunk of a started stream."""
        if self._chunked and not self._connection.lost:
            self._connection.send(_END_CHUNKS)

    def respond(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        close = (self._connection.closes_after(self._message)
                 or headers.get("Connection", "").lower() == "close")
        self._answered = True
        self._connection.send(head(status, {**headers, "Content-Length": str(len(body))},
                                   self.request_id, close) + body)
        if close:
            self._connection.close_after_answer()

    def abort(self) -> None:
        self._connection.abort()
