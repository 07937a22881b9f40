"""Keep-alive HTTP/1.1 connections to workers for the request path, parsed by httptools.

``UpstreamPool.post`` sends one request and returns its ``UpstreamResponse`` once the
status line and headers are in; the caller reads the body (``read``, ``readany``)
and must ``close`` it: a response read to its end on a keep-alive connection gives
the connection back to the pool, any other is closed (so a response abandoned
halfway, a client gone, cancels the request on the worker). What every request to a
worker shares (request line, ``Host``, the worker's headers, ``Content-Type:
application/json``) is encoded once per worker URL, path and headers object; a
request adds its ``Content-Length`` and body.

Guarantees: a connection is used by one request at a time; one that the worker
closed while idle is detected when it fails before any byte of its answer, and the
request is sent once more on a new connection (a worker never sees it twice: it
got none of it, or closed without answering); reading pauses while the caller
has ``MAX_BUFFERED_BYTES`` unread. An answer's head over ``MAX_HEAD_BYTES``, or its
body's framing (chunk-size lines, extensions, trailers) over ``MAX_FRAMING_BYTES``
plus one byte per ``PAYLOAD_BYTES_PER_FRAMING_BYTE`` of payload, is a failure: llhttp
buffers a header or trailer until it ends, so a worker's answer is bounded as a
client's request is (counted per read, O(1)). Failures are ``UpstreamError``
(``UpstreamConnectError`` when no connection could be opened within the connect
timeout); a response not over ``total_s`` after it was sent fails with
``TimeoutError``.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import urllib.parse
from collections.abc import Mapping
from typing import cast

import httptools

MAX_BUFFERED_BYTES = 256 * 1024
MAX_IDLE_PER_WORKER = 256
MAX_CACHED_HEADS = 4096  # (worker URL, path) pairs; past it the cache starts over
MAX_HEAD_BYTES = 64 * 1024
MAX_FRAMING_BYTES = 64 * 1024
PAYLOAD_BYTES_PER_FRAMING_BYTE = 8
# The read that ends a head may carry body bytes too: it is counted whole.
_LAST_READ_BYTES = 256 * 1024


class UpstreamError(Exception):
    """The connection broke, or the answer was not HTTP."""


class UpstreamConnectError(UpstreamError):
    """No connection could be opened."""


class _Connection(asyncio.Protocol):
    """One connection; the response being read is its only state."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        # The body's chunks go straight into this list (llhttp calls on_body per
        # chunk, with no Python frame); it is cleared in place, never replaced, and
        # data_received counts what each read added.
        self._chunks: list[bytes] = []
        self.on_body = self._chunks.append
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._buffered = 0
        self._fed = 0  # bytes fed in the head, then since the head ended
        self._payload = 0  # body bytes of the response, in all
        self._paused = False
        self.error: BaseException | None = None
        self.status = 0
        self.headers: dict[str, str] = {}
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.got_bytes = False

    def begin(self) -> None:
        """Reset for the next response on this connection."""
        self.head_done = self.complete = self.got_bytes = False
        self.headers = {}
        self._chunks.clear()
        self._buffered, self._fed, self._payload = 0, 0, 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        self._fed += len(data)
        if not self.head_done and self._fed > MAX_HEAD_BYTES + _LAST_READ_BYTES:
            self._fail(UpstreamError(f"answer head over {MAX_HEAD_BYTES} bytes"))
            return
        num_chunks = len(self._chunks)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError(f"bad HTTP answer: {exc}"))
            return
        if len(self._chunks) > num_chunks:
            added = sum(map(len, itertools.islice(self._chunks, num_chunks, None)))
            self._buffered += added
            self._payload += added
        if self._buffered > MAX_BUFFERED_BYTES and self.transport is not None:
            self.transport.pause_reading()
            self._paused = True
        self._wake()  # once per read, however many chunks it held
        framing = self._fed - self._payload
        if self.head_done and not self.complete and framing > MAX_FRAMING_BYTES and (
                framing > MAX_FRAMING_BYTES + self._payload // PAYLOAD_BYTES_PER_FRAMING_BYTE):
            self._fail(UpstreamError(f"answer framing (chunk sizes, extensions, trailers) "
                                     f"over {MAX_FRAMING_BYTES} bytes plus one per "
                                     f"{PAYLOAD_BYTES_PER_FRAMING_BYTE} of payload"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.complete:
            self._fail(UpstreamError(f"connection closed: {exc or 'by the worker'}"))
        self.keep_alive = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.keep_alive = self._parser.should_keep_alive()
        self.head_done, self._fed = True, 0
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self.keep_alive = False
        if self.transport is not None:
            self.transport.abort()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self) -> None:
        """Until something changed (bytes, the end, a failure)."""
        if self.error is not None:
            raise self.error
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None
        if self.error is not None and not self._chunks:
            raise self.error

    def take(self) -> bytes:
        """The body bytes received and not yet taken."""
        data = b"".join(self._chunks) if len(self._chunks) != 1 else self._chunks[0]
        self._chunks.clear()
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    @property
    def has_data(self) -> bool:
        """Body bytes are waiting."""
        return bool(self._chunks)

    def timed_out(self) -> None:
        """The response's time is up."""
        if not self.complete:
            self._fail(TimeoutError("upstream request timed out"))


class UpstreamResponse:
    """One response; see the module docstring."""

    def __init__(self, pool: UpstreamPool, key: tuple[str, int, bool],
                 connection: _Connection, timer: asyncio.TimerHandle) -> None:
        self._pool = pool
        self._key = key
        self._connection = connection
        self._timer = timer
        self.status = connection.status

    async def readany(self) -> bytes:
        """The next bytes of the body; ``b""`` at its end."""
        connection = self._connection
        while not connection.has_data:
            if connection.complete:
                return b""
            await connection.wait()
        return connection.take()

    async def read(self) -> bytes:
        """The rest of the body."""
        parts = []
        while data := await self.readany():
            parts.append(data)
        return b"".join(parts)

    def close(self) -> None:
        """Done with the response: the connection goes back to the pool when the body
        was read to its end on a keep-alive connection, else it is closed."""
        self._timer.cancel()
        connection = self._connection
        if connection.complete and connection.keep_alive and connection.error is None \
                and not connection.has_data:
            self._pool.release(self._key, connection)
        elif connection.transport is not None:
            connection.transport.abort()


class UpstreamPool:
    """Idle keep-alive connections per worker address."""

    def __init__(self, connect_timeout_s: float, total_s: float) -> None:
        self._connect_timeout_s = connect_timeout_s
        self._total_s = total_s
        self._idle: dict[tuple[str, int, bool], list[_Connection]] = {}
        # (worker URL, path) -> (the headers it was built from, connection key, head)
        self._heads: dict[tuple[str, str],
                          tuple[Mapping[str, str], tuple[str, int, bool], bytes]] = {}

    async def post(self, url: str, path: str, headers: Mapping[str, str], body: bytes
                   ) -> UpstreamResponse:
        """``POST url + path`` (a path in ``url`` comes first, as for every other call to
        the worker) of the JSON ``body`` with ``headers``; see the module docstring.
        The request's head is built once per worker URL, path and ``headers`` object
        (pass the same mapping each time, and a new one when its values change)."""
        key, head = self._head(url, path, headers)
        request = b"%b%d\r\n\r\n%b" % (head, len(body), body)
        loop = asyncio.get_running_loop()
        while True:
            connection = self._take_idle(key)
            reused = connection is not None
            if connection is None:
                connection = await self._connect(key)
            connection.begin()
            assert connection.transport is not None
            connection.transport.write(request)
            timer = loop.call_later(self._total_s, connection.timed_out)
            try:
                while not connection.head_done:
                    await connection.wait()
            except UpstreamError:
                timer.cancel()
                if reused and not connection.got_bytes:
                    continue  # closed by the worker while idle: it never saw this request
                raise
            except BaseException:
                timer.cancel()
                if connection.transport is not None:
                    connection.transport.abort()
                raise
            return UpstreamResponse(self, key, connection, timer)

    def release(self, key: tuple[str, int, bool], connection: _Connection) -> None:
        """Keep ``connection`` for the next request to the same worker."""
        idle = self._idle.setdefault(key, [])
        if len(idle) < MAX_IDLE_PER_WORKER:
            idle.append(connection)
        elif connection.transport is not None:
            connection.transport.close()

    def close(self) -> None:
        """Close every idle connection."""
        for idle in self._idle.values():
            for connection in idle:
                if connection.transport is not None:
                    connection.transport.close()
        self._idle.clear()

    def _take_idle(self, key: tuple[str, int, bool]) -> _Connection | None:
        idle = self._idle.get(key)
        while idle:
            connection = idle.pop()
            if connection.transport is not None and not connection.transport.is_closing() \
                    and connection.error is None:
                return connection
        return None

    async def _connect(self, key: tuple[str, int, bool]) -> _Connection:
        host, port, tls = key
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, connection = await loop.create_connection(
                    _Connection, host, port,
                    ssl=ssl.create_default_context() if tls else None)
        except (OSError, TimeoutError) as exc:
            raise UpstreamConnectError(f"cannot connect to {host}:{port}: "
                                       f"{type(exc).__name__}: {exc}") from exc
        return connection

    def _head(self, url: str, path: str, headers: Mapping[str, str]
              ) -> tuple[tuple[str, int, bool], bytes]:
        """The connection key of ``url`` and the head of a POST to ``path`` up to its
        ``Content-Length`` value: the constant part of every request to the worker."""
        cached = self._heads.get((url, path))
        if cached is not None and cached[0] is headers:
            return cached[1], cached[2]
        if len(self._heads) >= MAX_CACHED_HEADS:
            self._heads.clear()
        parts = urllib.parse.urlsplit(url)
        tls = parts.scheme == "https"
        key = (parts.hostname or "", parts.port or (443 if tls else 80), tls)
        lines = [f"POST {parts.path.rstrip('/')}{path} HTTP/1.1".encode(),
                 f"Host: {parts.netloc}".encode(),
                 *(f"{name}: {value}".encode("latin-1") for name, value in headers.items()),
                 b"Content-Type: application/json", b"Content-Length: "]
        head = b"\r\n".join(lines)
        self._heads[(url, path)] = (headers, key, head)
        return key, head
