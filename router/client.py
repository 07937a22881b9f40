"""The client side of one OpenAI request, as the request pipeline sees it.

``router.dispatch``, ``router.forward.proxy`` and ``router.forward.relay`` are
written against ``Client`` alone, so one pipeline serves both HTTP servers: the lean
HTTP/1.1 server (``router.server.http1_client``, which takes the OpenAI routes) and
aiohttp (``router.server.aiohttp_client``: an OpenAI request on a connection aiohttp
already holds).

Contract: a request is answered exactly once, either by ``respond`` (a whole answer)
or by ``start_stream`` followed by ``write`` calls (an SSE stream, ended by the server
when the pipeline returns). An ``ApiError`` raised before either is answered by the
server as an OpenAI-shaped error; any other exception as a 500 quoting the request id.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Mapping

import orjson

from radix.api_errors import ApiError

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
JSON_HEADERS = {"Content-Type": "application/json"}
log = logging.getLogger(__name__)


def body_too_large(max_bytes: int) -> ApiError:
    """The 413 for a request body over ``max_bytes`` (the connection closes: the rest of
    the body is not read)."""
    return ApiError(413, f"request body over {max_bytes} bytes for this key",
                    code="request_too_large", headers={"Connection": "close"})


class Client(abc.ABC):
    """One request's client: its headers and body, and the way to answer it."""

    request_id: str

    @abc.abstractmethod
    def header(self, name: str) -> str | None:
        """The request header ``name`` (case-insensitive), None when absent."""

    @abc.abstractmethod
    async def read_body(self, timeout_s: float, max_bytes: int) -> bytes:
        """The whole request body within ``timeout_s`` (ApiError 408 otherwise), refused
        with a 413 once it passes ``max_bytes``, before more of it is buffered."""

    @property
    @abc.abstractmethod
    def started(self) -> bool:
        """The client has received the head of a stream: it can only go on or end."""

    @abc.abstractmethod
    async def start_stream(self) -> None:
        """Send the head of a 200 SSE stream (``SSE_HEADERS``)."""

    @abc.abstractmethod
    async def write(self, data: bytes, timeout_s: float) -> None:
        """Send ``data`` on the started stream; waits while the client does not read
        (backpressure), at most ``timeout_s`` (then TimeoutError).
        ConnectionResetError when the client has gone away."""

    @abc.abstractmethod
    def respond(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        """Answer with a whole body (the stream was not started)."""

    def respond_json(self, status: int, value: object) -> None:
        """Answer with ``value`` as JSON."""
        self.respond(status, orjson.dumps(value), JSON_HEADERS)

    @abc.abstractmethod
    def abort(self) -> None:
        """Drop the connection at once (a client that does not read in time)."""


def error_answer(exc: BaseException, rid: str, where: str) -> ApiError:
    """The error a client gets for ``exc`` raised by the pipeline: an ``ApiError`` as it
    is, without its traceback and context (they hold the failed request's frames, and
    with them its body, until the collector runs); anything else is logged under the
    request id and becomes a 500 quoting it."""
    if isinstance(exc, ApiError):
        exc.__traceback__ = exc.__context__ = exc.__cause__ = None
        return exc
    log.error("request %s: unhandled error on %s", rid, where, exc_info=exc)
    return ApiError(500, f"internal router error (request id {rid})")
