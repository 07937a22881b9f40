"""The requests of one HTTP/1.1 connection, parsed by httptools (llhttp) under limits.

``RequestParser.feed`` turns a connection's bytes into ``Message`` objects: its
``on_head`` callback gets each request once its head is complete (its ``body``
future resolves when the body is), ``on_complete`` is called as each body
completes. The first limit broken or malformed byte stops parsing for good and
``feed`` returns the error to answer: 414 (URL over ``MAX_URL_BYTES``), 431 (head
over ``MAX_HEAD_BYTES`` or ``MAX_HEADERS``), 413 (body over ``max_body_bytes``, at
once when its ``Content-Length`` says so), 400 (``Content-Length`` with
``Transfer-Encoding``, a bad ``Content-Length`` or chunk size, an upgrade, anything
llhttp rejects). A request whose body was cut short by the error has that error
set on its ``body`` future.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import httptools

from radix.api_errors import ApiError

MAX_URL_BYTES = 8 * 1024
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100


class Message:
    """One parsed request; ``body`` resolves once it is complete (or fails with the
    ApiError that stopped parsing)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.url = b""
        self.method = b""
        self.version = "1.1"
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.headers: dict[bytes, bytes] = {}
        self.head_bytes = 0
        self.chunks: list[bytes] = []
        self.size = 0
        self.body: asyncio.Future[bytes] = loop.create_future()
        self.keep_alive = True
        self.endpoint: str | None = None
        self.error: ApiError | None = None
        self.continue_sent = False

    def raw(self, body: bytes) -> bytes:
        """The request re-written for aiohttp, framed by ``Content-Length``."""
        lines = [self.method + b" " + self.url + b" HTTP/" + self.version.encode()]
        lines += [n + b": " + v for n, v in self.raw_headers
                  if n.lower() not in (b"content-length", b"transfer-encoding", b"expect")]
        lines.append(b"Content-Length: %d" % len(body))
        return b"\r\n".join(lines) + b"\r\n\r\n" + body


class RequestParser:
    """One connection's request parser; see the module docstring."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_body_bytes: int,
                 endpoints: Mapping[bytes, str], on_head: Callable[[Message], None],
                 on_complete: Callable[[], None]) -> None:
        self._loop = loop
        self._max_body_bytes = max_body_bytes
        self._endpoints = endpoints
        self._on_head = on_head
        self._on_complete = on_complete
        self._parser = httptools.HttpRequestParser(self)
        self.current: Message | None = None
        self.stopped = False

    def feed(self, data: bytes) -> ApiError | None:
        """Parse ``data``; the error that stopped parsing, if it stopped now."""
        if self.stopped:
            return None
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            return self._stop(ApiError(400, "protocol upgrades are not supported"))
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            return self._stop(cause if isinstance(cause, ApiError) else ApiError(400, "bad request"))
        except httptools.HttpParserError as exc:
            return self._stop(ApiError(400, f"malformed request: {exc}"))
        return None

    def _stop(self, error: ApiError) -> ApiError:
        self.stopped = True
        return error

    def on_message_begin(self) -> None:
        self.current = Message(self._loop)

    def on_url(self, url: bytes) -> None:
        message = self.current
        assert message is not None
        message.url += url
        if len(message.url) > MAX_URL_BYTES:
            raise ApiError(414, f"request URL longer than {MAX_URL_BYTES} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        message = self.current
        assert message is not None
        message.raw_headers.append((name, value))
        message.head_bytes += len(name) + len(value) + 4
        if message.head_bytes > MAX_HEAD_BYTES or len(message.raw_headers) > MAX_HEADERS:
            raise ApiError(431, f"request head over {MAX_HEAD_BYTES} bytes or "
                           f"{MAX_HEADERS} headers")

    def on_headers_complete(self) -> None:
        message = self._current()
        parser = self._parser
        message.method = parser.get_method()
        message.version = parser.get_http_version()
        message.keep_alive = parser.should_keep_alive()
        headers = message.headers
        for name, value in message.raw_headers:  # the first of repeated names, as aiohttp
            headers.setdefault(name.lower(), value)
        if b"content-length" in headers and b"transfer-encoding" in headers:
            raise ApiError(400, "both Content-Length and Transfer-Encoding")
        length = headers.get(b"content-length", b"0")
        if not length.isdigit():
            raise ApiError(400, "bad Content-Length")
        if int(length) > self._max_body_bytes:
            raise ApiError(413, f"request body over {self._max_body_bytes} bytes")
        if message.method == b"POST":
            message.endpoint = self._endpoints.get(message.url.split(b"?", 1)[0])
        self._on_head(message)

    def on_body(self, body: bytes) -> None:
        message = self.current
        assert message is not None
        message.chunks.append(body)
        message.size += len(body)
        if message.size > self._max_body_bytes:
            raise ApiError(413, f"request body over {self._max_body_bytes} bytes")

    def on_message_complete(self) -> None:
        message = self._current()
        message.body.set_result(b"".join(message.chunks))
        message.chunks = []
        self.current = None
        self._on_complete()

    def _current(self) -> Message:
        assert self.current is not None
        return self.current
