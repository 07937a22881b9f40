"""One attempt to serve a request on one worker, streaming through without buffering.

``radix`` workers get ``POST /generate`` (the prompt as ``token_ids_b64``: its key
in base64, a tenth of the cost of JSON-encoding the id list; scope,
``num_public_tokens``, sampling) and their results are reshaped into OpenAI objects;
``openai`` workers get the validated fields only (``OpenAIRequest.upstream_body``:
completions prompts as the router's token ids, chat messages as rendered, the
tenant's ``cache_salt``) and their responses pass through.

Contract of ``Proxy.send``: either it answers the client (whole or streamed) and
returns an ``Exchange``, or it raises ``UpstreamUnavailable`` having sent the client
nothing, so the caller may try the next worker. A stream that fails after its first
byte ends with an error frame (no retry is possible then). A client that goes away
closes the upstream response, which cancels the request on the worker.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from radix.openai.requests import OpenAIRequest
from radix.openai.responses import (
    DONE_FRAME,
    ChoiceText,
    ResponseShape,
    TokenUsage,
    sse_frame,
    usage_object,
)
from router.config import ProxyConfig
from router.errors import ApiError
from router.registry import WorkerState
from router.tokenization import Prompt

CLIENT_CLOSED = 499  # the client went away (nginx's convention)
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_RETRIABLE_STATUS = frozenset({401, 403, 404, 408, 429})
_MAX_SSE_LINE_BYTES = 1 << 20


@dataclass(frozen=True)
class Call:
    """What to run, independent of which worker runs it."""

    request: OpenAIRequest
    model_name: str
    prompt: Prompt
    scope: str
    max_tokens: int | None
    cache_salt: str


@dataclass
class Exchange:
    """What happened: the status the client got, tokens generated, tokens the worker
    found cached, and when the first byte reached the client (monotonic seconds)."""

    status: int
    num_completion_tokens: int = 0
    num_cached_tokens: int | None = None
    first_byte_at: float | None = None


class UpstreamUnavailable(Exception):
    """The worker failed before the client got anything. ``unreachable`` means the
    connection itself failed; ``error`` is what the client sees if no worker is left."""

    def __init__(self, reason: str, unreachable: bool, error: ApiError) -> None:
        super().__init__(reason)
        self.unreachable = unreachable
        self.error = error


def _unavailable(worker: WorkerState, exc: BaseException) -> UpstreamUnavailable:
    reason = f"{worker.worker_id}: {type(exc).__name__}: {exc}"
    return UpstreamUnavailable(reason, isinstance(exc, aiohttp.ClientConnectorError),
                               ApiError(502, f"worker {worker.worker_id} failed: {reason}"))


class Proxy:
    """Sends attempts over one shared keep-alive ``aiohttp.ClientSession``."""

    def __init__(self, session: aiohttp.ClientSession, config: ProxyConfig) -> None:
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=config.request_timeout_s,
                                              sock_connect=config.connect_timeout_s)

    async def send(self, client: web.Request, call: Call, worker: WorkerState
                   ) -> tuple[web.StreamResponse, Exchange]:
        """Run ``call`` on ``worker``; see the module docstring for the contract."""
        if worker.kind == "radix":
            path, payload = "/generate", self._generate_body(call)
        else:
            path, payload = self._openai_body(call, worker)
        try:
            upstream = await self._session.post(
                worker.url + path, data=json.dumps(payload, separators=(",", ":")).encode(),
                headers={**worker.headers, "Content-Type": "application/json"},
                timeout=self._timeout)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unavailable(worker, exc) from exc
        try:
            if upstream.status != 200:
                raise await _status_error(worker, upstream, call.request)
            if worker.kind == "radix":
                if call.request.stream:
                    return await self._stream_generate(client, call, worker, upstream)
                return await self._whole_generate(call, worker, upstream)
            return await self._pass_openai(client, call, worker, upstream)
        finally:
            upstream.close()

    @staticmethod
    def _generate_body(call: Call) -> dict[str, Any]:
        return {"token_ids_b64": base64.b64encode(call.prompt.key).decode(),
                "scope": call.scope,
                "num_public_tokens": call.prompt.num_public_tokens,
                "sampling": call.request.sampling.to_wire(call.max_tokens),
                "stream": call.request.stream}

    @staticmethod
    def _openai_body(call: Call, worker: WorkerState) -> tuple[str, dict[str, Any]]:
        return call.request.upstream_body(worker.served_model, call.max_tokens,
                                          call.prompt.token_ids, call.cache_salt)

    async def _whole_generate(self, call: Call, worker: WorkerState,
                              upstream: aiohttp.ClientResponse
                              ) -> tuple[web.StreamResponse, Exchange]:
        try:
            result = json.loads(await upstream.read())
            body = ResponseShape(call.request.endpoint, call.model_name).whole(
                [ChoiceText(c["index"], c["text"], c["finish_reason"])
                 for c in result["choices"]],
                _generate_usage(result["usage"]))
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
            raise _unavailable(worker, exc) from exc
        exchange = Exchange(200, first_byte_at=time.monotonic())
        _note_usage(exchange, body["usage"])
        return web.json_response(body), exchange

    async def _stream_generate(self, client: web.Request, call: Call, worker: WorkerState,
                               upstream: aiohttp.ClientResponse
                               ) -> tuple[web.StreamResponse, Exchange]:
        shape = ResponseShape(call.request.endpoint, call.model_name)
        batches = _sse_batches(upstream)
        try:
            batch = await anext(batches)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise _unavailable(worker, exc) from exc
        if batch[0] is None:
            raise _unavailable(worker, EOFError("stream ended before its first event"))
        out = web.StreamResponse(headers=SSE_HEADERS)
        await out.prepare(client)
        exchange = Exchange(200, first_byte_at=time.monotonic())
        try:
            while True:
                frames, ended = _client_frames(batch, shape, call.request.include_usage,
                                               exchange)
                await out.write(frames)
                if ended:
                    return out, exchange
                batch = await anext(batches)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            await _end_stream_with_error(out, exchange, worker, exc)
        except ConnectionResetError:
            exchange.status = CLIENT_CLOSED
        return out, exchange

    async def _pass_openai(self, client: web.Request, call: Call, worker: WorkerState,
                           upstream: aiohttp.ClientResponse
                           ) -> tuple[web.StreamResponse, Exchange]:
        if not call.request.stream:
            try:
                result = json.loads(await upstream.read())
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                raise _unavailable(worker, exc) from exc
            result["model"] = call.model_name
            exchange = Exchange(200, first_byte_at=time.monotonic())
            _note_usage(exchange, result.get("usage"))
            return web.json_response(result), exchange
        try:
            first = await upstream.content.readline()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unavailable(worker, exc) from exc
        if not first:
            raise _unavailable(worker, EOFError("empty stream"))
        out = web.StreamResponse(headers=SSE_HEADERS)
        await out.prepare(client)
        exchange = Exchange(200, first_byte_at=time.monotonic())
        line = first
        try:
            while line:
                if b'"usage"' in line and line.startswith(b"data: {"):
                    chunk = json.loads(line[6:])
                    _note_usage(exchange, chunk.get("usage"))
                    if not chunk.get("choices") and not call.request.include_usage:
                        await upstream.content.readline()  # the blank line ending the event
                        line = await upstream.content.readline()
                        continue
                await out.write(line)
                line = await upstream.content.readline()
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            await _end_stream_with_error(out, exchange, worker, exc)
        except ConnectionResetError:
            exchange.status = CLIENT_CLOSED
        return out, exchange


async def _sse_batches(upstream: aiohttp.ClientResponse
                       ) -> AsyncIterator[list[dict[str, Any] | None]]:
    """The JSON objects of an SSE stream's ``data:`` lines, batched by network read
    (so the relay answers events that arrived together with one write instead of one
    syscall each, and never waits for more). ``None`` stands for ``[DONE]`` and ends
    the last batch; a stream that ends without it raises ``ClientPayloadError``."""
    pending = b""
    async for chunk in upstream.content.iter_any():
        *lines, pending = (pending + chunk).split(b"\n")
        if len(pending) > _MAX_SSE_LINE_BYTES:
            raise ValueError(f"SSE line longer than {_MAX_SSE_LINE_BYTES} bytes")
        batch: list[dict[str, Any] | None] = []
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                batch.append(None)
                yield batch
                return
            batch.append(json.loads(data))
        if batch:
            yield batch
    raise aiohttp.ClientPayloadError("stream ended before [DONE]")


def _client_frames(batch: list[dict[str, Any] | None], shape: ResponseShape,
                   include_usage: bool, exchange: Exchange) -> tuple[bytes, bool]:
    """The client's SSE bytes for one batch of ``/generate`` events, noting usage and
    errors in ``exchange``; True when the stream is over (``[DONE]`` or an error)."""
    frames = []
    for event in batch:
        if event is None:
            frames.append(DONE_FRAME)
            return b"".join(frames), True
        if "usage" in event:
            usage = _generate_usage(event["usage"])
            _note_usage(exchange, usage_object(usage))
            if include_usage:
                frames.append(shape.usage_chunk(usage))
        elif "error" in event:
            frames.append(sse_frame({"error": event["error"]}))
            exchange.status = 502
            return b"".join(frames), True
        else:
            frames.append(shape.chunk(event["index"], event["text"], event["finish_reason"]))
    return b"".join(frames), False


def _generate_usage(usage: dict[str, Any]) -> TokenUsage:
    """A ``/generate`` usage object as ``TokenUsage``."""
    return TokenUsage(int(usage["prompt_tokens"]), int(usage["completion_tokens"]),
                      int(usage["cached_tokens"]))


def _note_usage(exchange: Exchange, usage: Any) -> None:
    """Copy completion and cached token counts from an OpenAI ``usage`` object."""
    if isinstance(usage, dict):
        exchange.num_completion_tokens = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            exchange.num_cached_tokens = int(details["cached_tokens"])


async def _status_error(worker: WorkerState, upstream: aiohttp.ClientResponse,
                        request: OpenAIRequest) -> Exception:
    """The error for a non-200 answer: client errors pass through as the worker wrote
    them, the field named as the client sent it; overload, server errors and worker
    misconfiguration allow a retry."""
    try:
        body = json.loads(await upstream.read())
        message = str(body["error"]["message"])
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
        body, message = None, f"HTTP {upstream.status}"
    status = upstream.status
    if status >= 500 or status in _RETRIABLE_STATUS:
        return UpstreamUnavailable(
            f"{worker.worker_id}: HTTP {status}: {message}", False,
            ApiError(429 if status == 429 else 502, f"worker {worker.worker_id}: {message}",
                     headers={"Retry-After": "1"} if status == 429 else {}))
    details = body.get("error") if isinstance(body, dict) else None
    if not isinstance(details, dict):
        return ApiError(status, message)
    upstream_param = details.get("param")
    param = request.client_param(upstream_param) if isinstance(upstream_param, str) else None
    if param is not None and param != upstream_param:
        message = message.replace(upstream_param, param, 1)
    return ApiError(status, message, param=param, code=details.get("code"))


async def _end_stream_with_error(out: web.StreamResponse, exchange: Exchange,
                                 worker: WorkerState, exc: BaseException) -> None:
    exchange.status = 502
    error = ApiError(502, f"worker {worker.worker_id} failed mid-stream: {exc}")
    try:
        await out.write(sse_frame(error.body()))
    except ConnectionResetError:
        exchange.status = CLIENT_CLOSED
