"""The HTTP exchange of an attempt on one worker: its timeouts, and how it failed.

Timeouts (``ProxyConfig``), each a failure of the worker (``UpstreamUnavailable``):

- ``connect_timeout_s``: opening the TCP connection;
- ``first_byte_timeout_s``: from sending the request until the response headers,
  and again from the headers until a stream's first event (a worker sends its
  headers at once, so this bounds queueing and prefill);
- ``idle_timeout_s``: between two reads of a stream once it has begun;
- ``request_timeout_s``: the whole attempt.

A worker that answers ``503`` with code ``draining`` (SIGTERM) or whose connection
fails is ``worker_down``: the caller takes it out of routing at once, without waiting
for the next readiness probe.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson

from radix.api_errors import ApiError
from radix.openai.requests import OpenAIRequest
from router.config import ProxyConfig
from router.fleet.registry import WorkerState
from router.forward.pool import UpstreamConnectError, UpstreamError, UpstreamPool, UpstreamResponse

RETRY_AFTER_S = "1"
_RETRIABLE_STATUS = frozenset({401, 403, 404, 408, 429})
_MAX_SSE_LINE_BYTES = 1 << 20
# A broken connection, a timeout, or an answer that is not what the route promises.
MALFORMED = (UpstreamError, TimeoutError, ValueError, KeyError, TypeError)
Batch = list[dict[str, Any] | None]


class UpstreamUnavailable(Exception):
    """The worker failed this attempt. ``worker_down`` means it cannot serve now (its
    connection failed, or it is draining); ``error`` is what the client sees if no
    worker is left before its first byte."""

    def __init__(self, reason: str, worker_down: bool, error: ApiError) -> None:
        super().__init__(reason)
        self.worker_down = worker_down
        self.error = error


def worker_failed(code: str = "upstream_error") -> ApiError:
    """The 502 a client gets when its worker failed and no other could take over."""
    return ApiError(502, "the worker failed to answer; retry, or quote the X-Request-Id "
                    "to the operator", code=code)


def unavailable(worker: WorkerState, exc: BaseException) -> UpstreamUnavailable:
    """``exc`` (a broken connection, a timeout, a malformed answer) as a failed attempt."""
    reason = f"{worker.worker_id}: {type(exc).__name__}: {exc}"
    return UpstreamUnavailable(reason, isinstance(exc, UpstreamConnectError), worker_failed())


class Upstream:
    """Opens attempts over the keep-alive connections of an ``UpstreamPool``."""

    def __init__(self, pool: UpstreamPool, config: ProxyConfig) -> None:
        self._pool = pool
        self._config = config

    async def post(self, worker: WorkerState, path: str, body: bytes,
                   request: OpenAIRequest) -> UpstreamResponse:
        """``POST worker.url + path`` of the JSON ``body`` with the worker's headers; the
        200 response (the caller closes it), else ``UpstreamUnavailable`` (retriable
        status, failure, first-byte timeout) or ``ApiError`` (a client error the worker
        found, passed through)."""
        try:
            async with asyncio.timeout(self._config.first_byte_timeout_s):
                response = await self._pool.post(worker.url, path, worker.headers, body)
        except (UpstreamError, TimeoutError) as exc:
            raise unavailable(worker, exc) from exc
        if response.status != 200:
            try:
                raise await _status_error(worker, response, request)
            finally:
                response.close()
        return response

    async def line_batches(self, response: UpstreamResponse) -> AsyncIterator[list[bytes]]:
        """The complete lines of a stream (without their ``\\n``), batched by network
        read (lines that arrived together go to the client in one write). The first
        read must come within the first-byte timeout, every later one within the idle
        timeout (comments and heartbeats count); a stream that ends before its caller
        stops reading raises ``UpstreamError``."""
        pending = b""
        timeout_s = self._config.first_byte_timeout_s
        while True:
            async with asyncio.timeout(timeout_s):
                chunk = await response.readany()
            if not chunk:
                raise UpstreamError("stream ended before [DONE]")
            *lines, pending = (pending + chunk).split(b"\n")
            if len(pending) > _MAX_SSE_LINE_BYTES:
                raise ValueError(f"SSE line longer than {_MAX_SSE_LINE_BYTES} bytes")
            if lines:
                yield lines
                timeout_s = self._config.idle_timeout_s

    async def sse_batches(self, response: UpstreamResponse) -> AsyncIterator[Batch]:
        """The JSON objects of an SSE stream's ``data:`` lines, batched by network read
        as ``line_batches``. ``None`` stands for ``[DONE]`` and ends the last batch."""
        async for lines in self.line_batches(response):
            batch: Batch = []
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    batch.append(None)
                    yield batch
                    return
                batch.append(orjson.loads(data))
            if batch:
                yield batch


async def _status_error(worker: WorkerState, upstream: UpstreamResponse,
                        request: OpenAIRequest) -> Exception:
    """The error for a non-200 answer: client errors pass through as the worker wrote
    them, the field named as the client sent it; overload, server errors and worker
    misconfiguration allow a retry (a 429 becomes the router's 503 ``saturated`` when
    no worker is left; a draining worker is down)."""
    try:
        body = orjson.loads(await upstream.read())
        message = str(body["error"]["message"])
    except MALFORMED:
        body, message = None, f"HTTP {upstream.status}"
    status = upstream.status
    details = body.get("error") if isinstance(body, dict) else None
    code = details.get("code") if isinstance(details, dict) else None
    if status >= 500 or status in _RETRIABLE_STATUS:
        draining = status == 503 and code == "draining"
        error = worker_failed()
        if status == 429 or draining:
            error = ApiError(503, "every worker is saturated or draining; retry later",
                             code="saturated", headers={"Retry-After": RETRY_AFTER_S})
        return UpstreamUnavailable(f"{worker.worker_id}: HTTP {status}: {message}", draining,
                                   error)
    if not isinstance(details, dict):
        return ApiError(status, message)
    upstream_param = details.get("param")
    param = request.client_param(upstream_param) if isinstance(upstream_param, str) else None
    if param is not None and param != upstream_param:
        message = message.replace(upstream_param, param, 1)
    return ApiError(status, message, param=param, code=code)
