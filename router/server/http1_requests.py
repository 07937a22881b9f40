"""The requests of one HTTP/1.1 connection, parsed by httptools (llhttp) under limits.

``RequestParser.feed`` turns a connection's bytes into ``Message`` objects: its
``on_head`` callback gets each request once its head is complete (its ``body``
future resolves when the body is), ``on_complete`` is called as each body
completes. The first limit broken or malformed byte stops parsing for good and
``feed`` returns the error to answer: 414 (URL over ``MAX_URL_BYTES``), 431 (head
over ``MAX_HEAD_BYTES`` or ``MAX_HEADERS``: counted as the bytes arrive, since llhttp
reports a header only once it is complete and a header that never ends would
otherwise grow in the parser's buffer without bound), 413 (body over ``max_body_bytes``, at
once when its ``Content-Length`` says so), 400 ``framing_too_large`` (a body's bytes
that are not payload, its chunk-size lines, extensions and trailers, over
``MAX_FRAMING_BYTES`` plus one per ``PAYLOAD_BYTES_PER_FRAMING_BYTE`` of payload:
llhttp buffers a trailer field until it ends, and reads an extension without end),
400 (``Content-Length`` with
``Transfer-Encoding``, a bad ``Content-Length`` or chunk size, an upgrade, anything
llhttp rejects). A request whose body was cut short by the error has that error
set on its ``body`` future.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import httptools

from radix.api_errors import ApiError
from router.client import body_too_large

MAX_URL_BYTES = 8 * 1024
# What of a body is read before its bound is known (the tenant's, once its key and
# slot are checked): past it, reading pauses until then.
UNBOUNDED_BODY_BYTES = 64 * 1024
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100
# What of a body is not payload (chunk-size lines, extensions, trailers): this much,
# plus one byte per PAYLOAD_BYTES_PER_FRAMING_BYTE of payload (a 1 KiB chunk's line
# and CRLFs take 7 bytes; 1-byte chunks are refused after about 13,000 of them).
MAX_FRAMING_BYTES = 64 * 1024
PAYLOAD_BYTES_PER_FRAMING_BYTE = 8
# The last read may carry the end of a head and then the body: it is counted whole.
_LAST_READ_BYTES = 256 * 1024


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
        self.max_body_bytes: int | None = None
        self.sink: Callable[[bytes], None] | None = None

    def limit_body(self, max_bytes: int) -> None:
        """Refuse this body past ``max_bytes``: at once when its ``Content-Length`` or
        what arrived says so, else as soon as more arrives (``refuse``)."""
        self.max_body_bytes = max_bytes
        length = self.headers.get(b"content-length", b"0")
        if self.size > max_bytes or (length.isdigit() and int(length) > max_bytes):
            self.refuse(body_too_large(max_bytes))

    def refuse(self, error: ApiError) -> None:
        """Fail the body with ``error``, a body already complete too (unless it failed
        already); what arrives of it from now on is dropped unread (so the client can
        still read the answer), not kept."""
        self.chunks, self.sink = [], _drop
        if self.body.done():
            if self.body.cancelled() or self.body.exception() is not None:
                return  # it failed already, for its own reason
            self.body = self.body.get_loop().create_future()
        self.body.set_exception(error)
        self.body.exception()  # retrieved: the pipeline may not be reading it

    def raw(self, body: bytes) -> bytes:
        """The request re-written for aiohttp, framed by ``Content-Length``."""
        return self._raw_head(b"Content-Length: %d" % len(body)) + body

    def raw_chunked_head(self) -> bytes:
        """The request's head re-written for aiohttp, its body to follow in chunks
        (``chunk``) as it arrives."""
        return self._raw_head(b"Transfer-Encoding: chunked")

    def _raw_head(self, framing: bytes) -> bytes:
        lines = [self.method + b" " + self.url + b" HTTP/" + self.version.encode()]
        lines += [n + b": " + v for n, v in self.raw_headers
                  if n.lower() not in (b"content-length", b"transfer-encoding", b"expect")]
        lines.append(framing)
        return b"\r\n".join(lines) + b"\r\n\r\n"

    def take_chunks(self) -> bytes:
        """The body received so far, no longer kept here (it goes on by ``sink``)."""
        data, self.chunks = b"".join(self.chunks), []
        return data


def framing_budget(payload_bytes: int) -> int:
    """The most bytes a body with ``payload_bytes`` of payload may spend on anything
    else (chunk-size lines, extensions, trailers)."""
    return MAX_FRAMING_BYTES + payload_bytes // PAYLOAD_BYTES_PER_FRAMING_BYTE


def framing_too_large() -> ApiError:
    """The 400 for a body whose framing passed ``framing_budget``."""
    return ApiError(400, f"request body framing (chunk sizes, extensions, trailers) over "
                    f"{MAX_FRAMING_BYTES} bytes plus one per "
                    f"{PAYLOAD_BYTES_PER_FRAMING_BYTE} of payload", code="framing_too_large")


def _drop(data: bytes) -> None:
    """A refused body's sink."""


def chunk(data: bytes) -> bytes:
    """``data`` as one chunk of a chunked body (empty: the last chunk)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


class RequestParser:
    """One connection's request parser; see the module docstring."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_body_bytes: int,
                 endpoints: Mapping[bytes, str], on_head: Callable[[Message], None],
                 on_complete: Callable[[], None], on_body_held: Callable[[], None]) -> None:
        self._loop = loop
        self._on_body_held = on_body_held
        self._max_body_bytes = max_body_bytes
        self._endpoints = endpoints
        self._on_head = on_head
        self._on_complete = on_complete
        self._parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self.current: Message | None = None
        self._in_head = False
        self._head_bytes_fed = 0
        self._body_bytes_fed = 0  # fed since the current head ended

    def feed(self, data: bytes) -> ApiError | None:
        """Parse ``data``; the error that stopped parsing, if it stopped now. Bytes fed
        while a head is incomplete count toward the head's limit before llhttp sees
        any of them: a head still open after ``MAX_HEAD_BYTES`` + ``MAX_URL_BYTES`` of
        them is a 431, whatever its headers look like. Bytes fed while a body is open
        and not delivered as its payload are its framing: past its budget
        (``framing_budget``), a 400. Both checks are O(1) per call."""
        parser = self._parser
        if parser is None:
            return None
        if self._in_head or self.current is None:
            self._head_bytes_fed += len(data)
            if self._head_bytes_fed > MAX_HEAD_BYTES + MAX_URL_BYTES + _LAST_READ_BYTES:
                return self._stop(ApiError(431, f"request head over {MAX_HEAD_BYTES} bytes"))
        else:
            self._body_bytes_fed += len(data)
        error = self._parse(parser, data)
        message = self.current
        if error is None and message is not None and not self._in_head:
            framing = self._body_bytes_fed - message.size
            if framing > MAX_FRAMING_BYTES and framing > framing_budget(message.size):
                error = self._stop(framing_too_large())
        return error

    def _parse(self, parser: httptools.HttpRequestParser, data: bytes) -> ApiError | None:
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            return self._stop(ApiError(400, "protocol upgrades are not supported"))
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            return self._stop(cause if isinstance(cause, ApiError) else ApiError(400, "bad request"))
        except httptools.HttpParserError as exc:
            return self._stop(ApiError(400, f"malformed request: {exc}"))
        return None

    @property
    def stopped(self) -> bool:
        """Parsing has stopped (an error, or ``release``): ``feed`` drops what comes."""
        return self._parser is None

    def release(self) -> None:
        """Stop parsing and let go of llhttp's parser now, with what it buffered (up to
        a head's limit): the parser and this object refer to each other, and a cycle
        would wait for the collector, which a router runs rarely (``tune_gc``)."""
        self._parser = None

    def _stop(self, error: ApiError) -> ApiError:
        self.release()
        return error

    def on_message_begin(self) -> None:
        self.current = Message(self._loop)
        self._in_head = True

    def on_url(self, url: bytes) -> None:
        message = self.current
        assert message is not None
        message.url += url
        if len(message.url) > MAX_URL_BYTES:
            raise ApiError(414, f"request URL longer than {MAX_URL_BYTES} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        message = self.current
        assert message is not None
        message.head_bytes += len(name) + len(value) + 4
        if not self._in_head:  # a chunked body's trailer: counted, never a header
            if message.head_bytes > MAX_HEAD_BYTES:
                raise ApiError(431, f"request trailers over {MAX_HEAD_BYTES} bytes")
            return
        message.raw_headers.append((name, value))
        if message.head_bytes > MAX_HEAD_BYTES or len(message.raw_headers) > MAX_HEADERS:
            raise ApiError(431, f"request head over {MAX_HEAD_BYTES} bytes or "
                           f"{MAX_HEADERS} headers")

    def on_headers_complete(self) -> None:
        self._in_head, self._head_bytes_fed, self._body_bytes_fed = False, 0, 0
        message = self._current()
        parser = self._parser
        assert parser is not None
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
        if message.sink is None:
            message.chunks.append(body)
        else:
            message.sink(body)
        message.size += len(body)
        if message.size > self._max_body_bytes:
            message.chunks = []
            raise ApiError(413, f"request body over {self._max_body_bytes} bytes")
        if message.max_body_bytes is not None and message.size > message.max_body_bytes:
            message.refuse(body_too_large(message.max_body_bytes))
        elif (message.max_body_bytes is None and message.sink is None
              and message.size > UNBOUNDED_BODY_BYTES):
            self._on_body_held()

    def on_message_complete(self) -> None:
        message = self._current()
        if not message.body.done():
            message.body.set_result(b"".join(message.chunks))
        message.chunks = []
        self.current = None
        self._on_complete()

    def _current(self) -> Message:
        assert self.current is not None
        return self.current
