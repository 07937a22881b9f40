"""The lean HTTP/1.1 server of the OpenAI routes: an ``asyncio.Protocol`` parsed by
httptools (llhttp), on the router's event loop.

Each connection parses requests as bytes arrive and answers them one at a time, in
order (pipelined requests wait in a queue; reading pauses past
``MAX_QUEUED_REQUESTS``). ``POST /v1/completions`` and ``POST /v1/chat/completions``
run the pipeline (``Http1Settings.serve``) on an ``Http1Client``; the first request
for any other route hands the connection to aiohttp for the rest of its life: that
request and every later one go to an aiohttp protocol as requests re-written from
the parsed ones (``Content-Length`` framing, no ``Transfer-Encoding``, no
``Expect``), so aiohttp never sees bytes it could frame differently from us, until
no parsed byte is left over: the socket is then aiohttp's own.

Guarantees (the parsing limits are ``router.server.http1_requests``'):

- A request refused by a limit or as malformed is answered in its turn with
  ``Connection: close``, and nothing after it on the connection is read.
- Time: a connection with no complete request head ``keepalive_timeout_s`` after it
  opened or after its last answer is closed; a body not complete
  ``body_timeout_s`` after the pipeline began reading it is a 408 (then closed).
- ``Expect: 100-continue`` is answered when the body is first needed.
- A connection closes after ``MAX_REQUESTS_PER_CONNECTION`` requests, after a request
  that asked to, and after an answer sent before its request's body was read.
- A client that goes away cancels its request's pipeline (as aiohttp's handler
  cancellation does); ``write`` waits while the client's buffer is full.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import cast

import orjson

from radix.api_errors import ApiError
from router.client import JSON_HEADERS, error_answer
from router.server.http1_client import CONTINUE, Http1Client, head
from router.server.http1_requests import Message, RequestParser, chunk

MAX_REQUESTS_PER_CONNECTION = 10_000
MAX_QUEUED_REQUESTS = 8
WRITE_HIGH_WATER_BYTES = 64 * 1024
LINGER_S = 2.0
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Http1Settings:
    """What the server runs and its limits. ``serve(client, endpoint)`` is the
    pipeline, ``endpoints`` maps a POST path to its endpoint, ``handoff`` makes the
    aiohttp protocol for connections that ask for anything else, ``count_refusal``
    counts each refusal the server makes itself (the pipeline counts its own)."""

    serve: Callable[[Http1Client, str], Awaitable[None]]
    endpoints: Mapping[bytes, str]
    handoff: Callable[[], asyncio.Protocol]
    count_refusal: Callable[[ApiError], None]
    max_body_bytes: int
    keepalive_timeout_s: float
    connections: set[Http1Connection] = field(default_factory=set)


class Http1Connection(asyncio.Protocol):
    """One client connection; see the module docstring."""

    def __init__(self, settings: Http1Settings) -> None:
        self._settings = settings
        self._loop = asyncio.get_running_loop()
        self._requests = RequestParser(self._loop, settings.max_body_bytes, settings.endpoints,
                                       self._queued, self._completed, self._hold_body)
        self._queue: deque[Message] = deque()
        self._task: asyncio.Task[None] | None = None
        self._transport: asyncio.Transport | None = None
        self._aiohttp: asyncio.Protocol | None = None
        self._idle_timer: asyncio.TimerHandle | None = None
        self._write_ready: asyncio.Future[None] | None = None
        self._num_requests = 0
        self._num_forwarded = 0
        self._closing = False
        self._reading_paused = False
        self._queue_full = False
        self._body_held = False
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._transport.set_write_buffer_limits(WRITE_HIGH_WATER_BYTES)
        self._settings.connections.add(self)
        self._arm_idle_timer()

    def data_received(self, data: bytes) -> None:
        error = self._requests.feed(data)
        if error is not None:
            self._fail(error)
        else:
            self._switch_if_clean()

    def eof_received(self) -> bool:
        """A client that ends its side has gone (as aiohttp takes it): the transport
        closes, which cancels a request in progress."""
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._requests.release()
        self._settings.connections.discard(self)
        self._cancel_idle_timer()
        if self._write_ready is not None and not self._write_ready.done():
            self._write_ready.set_exception(ConnectionResetError("the client went away"))
            self._write_ready.exception()  # retrieved: nobody may be waiting
        if self._task is not None:
            self._task.cancel()
        if self._aiohttp is not None:
            self._aiohttp.connection_lost(exc)

    def pause_writing(self) -> None:
        self._write_ready = self._loop.create_future()
        if self._aiohttp is not None:
            self._aiohttp.pause_writing()

    def resume_writing(self) -> None:
        if self._write_ready is not None and not self._write_ready.done():
            self._write_ready.set_result(None)
        self._write_ready = None
        if self._aiohttp is not None:
            self._aiohttp.resume_writing()

    def _queued(self, message: Message) -> None:
        """A request's head is complete: it waits its turn."""
        self._cancel_idle_timer()
        self._queue.append(message)
        if len(self._queue) > MAX_QUEUED_REQUESTS:
            self._queue_full = True
            self._set_reading()
        self._next()

    def _hold_body(self) -> None:
        """The body being parsed passed ``UNBOUNDED_BODY_BYTES`` before its bound is
        known: read no more until it is (``release_body``)."""
        self._body_held = True
        self._set_reading()

    def release_body(self) -> None:
        """The body's bound is known (or it goes to aiohttp as it comes): read again."""
        self._body_held = False
        self._set_reading()

    def _set_reading(self) -> None:
        """Pause reading while too many requests wait or a body waits for its bound,
        read otherwise; once parsing has stopped, ``_fail`` and ``_close`` decide."""
        paused = self._queue_full or self._body_held
        if (paused != self._reading_paused and self._transport is not None
                and not self._requests.stopped):
            (self._transport.pause_reading if paused else self._transport.resume_reading)()
            self._reading_paused = paused

    def _completed(self) -> None:
        if self._aiohttp is not None:
            self._forward_ready()

    def send(self, data: bytes) -> None:
        """Write ``data`` to the client (nothing once it has gone)."""
        if not self.lost and self._transport is not None:
            self._transport.write(data)

    @property
    def write_paused(self) -> bool:
        """The client's buffer is over its high-water mark."""
        return self._write_ready is not None

    async def drain(self) -> None:
        """Wait until the client's buffer is under its high-water mark."""
        if self._write_ready is not None:
            await self._write_ready

    def send_continue(self, message: Message) -> None:
        """``100 Continue`` for a request that expects it, once."""
        if message.headers.get(b"expect", b"").lower() == b"100-continue" and not (
                message.continue_sent or message.body.done()):
            message.continue_sent = True
            self.send(CONTINUE)

    def closes_after(self, message: Message) -> bool:
        """Whether the connection closes after answering ``message``."""
        return (self._closing or not message.keep_alive or not message.body.done()
                or message.body.exception() is not None
                or (self._requests.stopped and self._queue[-1] is message)
                or self._num_requests + 1 >= MAX_REQUESTS_PER_CONNECTION)

    def close_after_answer(self) -> None:
        """Close once the answer being sent is out."""
        self._closing = True

    def abort(self) -> None:
        """Drop the connection at once."""
        if self._transport is not None:
            self._transport.abort()

    def shut_down(self) -> None:
        """Close now if idle, else after the answer in progress (draining)."""
        self._closing = True
        if self._task is None and not self._queue and self._aiohttp is None:
            self._close()

    @property
    def handed_off(self) -> bool:
        """aiohttp serves this connection now."""
        return self._aiohttp is not None

    def _next(self) -> None:
        if self._task is None and self._queue and self._aiohttp is None:
            self._task = self._loop.create_task(self._work())

    async def _work(self) -> None:
        try:
            while self._queue and not self.lost:
                message = self._queue[0]
                if message.error is not None or message.endpoint is None:
                    self._answer_error(message) if message.error else self._handoff()
                    return
                await self._serve(message)
                self._queue.popleft()
                self._num_requests += 1
                if self._closing or self.closes_after(message):
                    self._close()
                    return
                self._queue_full = False
                self._set_reading()
            self._arm_idle_timer()
        finally:
            self._task = None

    async def _serve(self, message: Message) -> None:
        client = Http1Client(self, message)
        assert message.endpoint is not None
        try:
            await self._settings.serve(client, message.endpoint)
            if not client.answered:
                raise RuntimeError("the pipeline returned without an answer")
        except Exception as exc:
            if client.answered:
                log.error("request %s: failed after its answer began", client.request_id,
                          exc_info=exc)
                self.abort()
                return
            error = error_answer(exc, client.request_id, message.url.decode("latin-1"))
            client.respond(error.status, orjson.dumps(error.body()),
                           {**error.headers, **JSON_HEADERS})
        if client.started:
            client.end_stream()

    def _answer_error(self, message: Message) -> None:
        assert message.error is not None
        self._settings.count_refusal(message.error)
        body = orjson.dumps(message.error.body())
        self.send(head(message.error.status, {**JSON_HEADERS, "Content-Length": str(len(body))},
                       "-", close=True) + body)
        self._close()

    def _fail(self, error: ApiError) -> None:
        """Stop parsing: the request being parsed (or a placeholder) is answered with
        ``error`` in its turn, and the connection closes after it."""
        message = self._requests.current
        if message is not None and message in self._queue:
            if not message.body.done():  # else refused already (``Message.refuse``)
                message.body.set_exception(error)
                message.body.exception()  # retrieved: the pipeline may not be reading it
        else:
            message = message or Message(self._loop)
            message.error = error
            self._queue.append(message)
        if self._transport is not None:
            self._transport.pause_reading()
        if self._aiohttp is not None:
            self._forward_ready()
        self._next()

    def _handoff(self) -> None:
        """Give the connection to aiohttp from the request at the head of the queue."""
        self._cancel_idle_timer()
        self._aiohttp = self._settings.handoff()
        self._aiohttp.connection_made(self._transport)
        self._forward_ready()
        self._switch_if_clean()

    def _switch_if_clean(self) -> None:
        """Once aiohttp has every byte parsed so far, let it read the socket itself."""
        if self._aiohttp is None or self._queue or self._requests.current is not None \
                or self.lost:
            return
        assert self._transport is not None
        self._settings.connections.discard(self)
        self._transport.set_protocol(self._aiohttp)

    def _forward_ready(self) -> None:
        """Pass aiohttp the queued requests in order: a whole one at once, one whose body
        is still arriving as its head and then its body in chunks as they come (so no
        body waits here for its handler, which authenticates first)."""
        aiohttp_protocol = self._aiohttp
        assert aiohttp_protocol is not None
        while self._queue:
            message = self._queue[0]
            done = message.body.done()
            error = message.error or (message.body.exception() if done else None)
            if error is not None:  # answered by us only while aiohttp is answering nothing
                if self._num_forwarded == 0 and message.sink is None and isinstance(
                        error, ApiError):
                    message.error = error
                    self._answer_error(message)
                    return
                if isinstance(error, ApiError):
                    self._settings.count_refusal(error)
                self._close(half_close=False)  # aiohttp may be writing its answer
                return
            if message.sink is None and done:
                aiohttp_protocol.data_received(message.raw(message.body.result()))
            else:
                if message.sink is None:
                    received = message.take_chunks()
                    aiohttp_protocol.data_received(message.raw_chunked_head()
                                                   + (chunk(received) if received else b""))
                    message.sink = lambda data: aiohttp_protocol.data_received(chunk(data))
                if not done:
                    break
                aiohttp_protocol.data_received(chunk(b""))
            self._queue.popleft()
            self._num_forwarded += 1
        if self._queue:
            self.send_continue(self._queue[0])
        self._queue_full = self._body_held = False  # bodies now stream to aiohttp
        self._set_reading()

    def _close(self, half_close: bool = True) -> None:
        """Close; when the client may still be sending (a request refused before its
        body was read), first end our side (unless not ``half_close``: aiohttp may
        still write its answer meanwhile) and read and drop what comes for up to
        ``LINGER_S``, so that its unread bytes do not reset the connection before it
        reads the answer."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        message = self._queue[0] if self._queue else None
        if not (self._requests.stopped or self._requests.current is not None
                or (message is not None and not message.body.done())):
            transport.close()
            return
        self._requests.release()
        if half_close:
            with contextlib.suppress(OSError, RuntimeError):
                transport.write_eof()
        transport.resume_reading()
        self._loop.call_later(LINGER_S, transport.close)

    def _arm_idle_timer(self) -> None:
        self._cancel_idle_timer()
        if self._closing:
            self._close()
            return
        self._idle_timer = self._loop.call_later(self._settings.keepalive_timeout_s,
                                                 self._idle_timeout)

    def _idle_timeout(self) -> None:
        if not self._queue and self._task is None and self._aiohttp is None:
            self._close()

    def _cancel_idle_timer(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
