"""One attempt to serve a request on one worker, streaming through without buffering.

``radix`` workers get ``POST /generate`` (the prompt as ``token_ids_b64``: its key
in base64, a tenth of the cost of JSON-encoding the id list; scope,
``num_public_tokens``, sampling) and their results are reshaped into OpenAI objects;
``openai`` workers get ``/v1/completions`` with the validated fields only
(``OpenAIRequest.upstream_body``: the router's token ids as the prompt, chat
messages rendered by the router with content as text, the tenant's
``cache_salt``); completions answers pass through, chat requests' answers are
reshaped into chat objects like a radix worker's.

Contract of ``Proxy.send``: either it answers the client (whole or streamed),
filling in the caller's ``Exchange`` as it goes, or it raises ``UpstreamUnavailable``
having sent the client nothing, so the caller may try the next worker. A stream
that fails after its first byte ends with an error event and then ``data: [DONE]``
(no retry is possible then); on a passed-through ``openai`` stream, a backend's own
error event or an end without ``[DONE]`` is such a failure. A client that goes away
closes the upstream response, which cancels the request on the worker; the exchange
then holds the completion tokens streamed so far, which is what the tenant is charged.

Errors sent to clients name no worker address and no exception text: the detail is
logged under the request id (``router.server.request_ids``).
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from radix.openai.requests import COMPLETIONS, OpenAIRequest
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
from router.server.request_ids import request_id
from router.tokenization import Prompt

log = logging.getLogger(__name__)
CLIENT_CLOSED = 499  # the client went away (nginx's convention)
RETRY_AFTER_S = "1"
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
# Upstream objects (``None`` for ``[DONE]``) to ``/generate``-style events.
EventTranslator = Callable[[list[dict[str, Any] | None]], list[dict[str, Any] | None]]
_RETRIABLE_STATUS = frozenset({401, 403, 404, 408, 429})
_MAX_SSE_LINE_BYTES = 1 << 20
# A broken connection or an answer that is not what the route promises.
_MALFORMED = (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError)


@dataclass(frozen=True)
class Call:
    """What to run, independent of which worker runs it."""

    request: OpenAIRequest
    model_name: str
    prompt: Prompt
    scope: str
    max_tokens: int | None
    cache_salt: str
    max_cached_tokens: int | None = None


@dataclass
class Exchange:
    """What happened: the status the client got, completion tokens sent to the client
    (counted as they stream; the worker's final usage when it arrives), tokens the
    worker found cached, and when the first byte reached the client (monotonic
    seconds). The caller creates it; ``Proxy.send`` fills it in."""

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


def _worker_failed(code: str = "upstream_error") -> ApiError:
    return ApiError(502, "the worker failed to answer; retry, or quote the X-Request-Id "
                    "to the operator", code=code)


def _unavailable(worker: WorkerState, exc: BaseException) -> UpstreamUnavailable:
    reason = f"{worker.worker_id}: {type(exc).__name__}: {exc}"
    return UpstreamUnavailable(reason, isinstance(exc, aiohttp.ClientConnectorError),
                               _worker_failed())


class Proxy:
    """Sends attempts over one shared keep-alive ``aiohttp.ClientSession``."""

    def __init__(self, session: aiohttp.ClientSession, config: ProxyConfig) -> None:
        self._session = session
        self._timeout = aiohttp.ClientTimeout(total=config.request_timeout_s,
                                              sock_connect=config.connect_timeout_s)

    async def send(self, client: web.Request, call: Call, worker: WorkerState,
                   exchange: Exchange) -> web.StreamResponse:
        """Run ``call`` on ``worker``, filling in ``exchange``; see the module docstring
        for the contract."""
        try:
            return await self._send(client, call, worker, exchange)
        except UpstreamUnavailable as exc:
            log.warning("request %s: worker unavailable: %s", request_id(client), exc)
            raise

    async def _send(self, client: web.Request, call: Call, worker: WorkerState,
                    exchange: Exchange) -> web.StreamResponse:
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
            if worker.kind == "openai" and call.request.endpoint == COMPLETIONS:
                return await self._pass_openai(client, call, worker, upstream, exchange)
            translate = _generate_events if worker.kind == "radix" else _completion_events
            if call.request.stream:
                return await self._stream_shaped(client, call, worker, upstream, exchange,
                                                 translate)
            return await self._whole_shaped(call, worker, upstream, exchange)
        finally:
            upstream.close()

    @staticmethod
    def _generate_body(call: Call) -> dict[str, Any]:
        body = {"token_ids_b64": base64.b64encode(call.prompt.key).decode(),
                "scope": call.scope,
                "num_public_tokens": call.prompt.num_public_tokens,
                "sampling": call.request.sampling.to_wire(call.max_tokens),
                "stream": call.request.stream}
        if call.max_cached_tokens is not None:
            body["max_cached_tokens"] = call.max_cached_tokens
        return body

    @staticmethod
    def _openai_body(call: Call, worker: WorkerState) -> tuple[str, dict[str, Any]]:
        return call.request.upstream_body(worker.served_model, call.max_tokens,
                                          call.prompt.token_ids, call.cache_salt)

    async def _whole_shaped(self, call: Call, worker: WorkerState,
                            upstream: aiohttp.ClientResponse, exchange: Exchange
                            ) -> web.StreamResponse:
        try:
            result = json.loads(await upstream.read())
            body = ResponseShape(call.request.endpoint, call.model_name).whole(
                [ChoiceText(c["index"], c["text"], c["finish_reason"])
                 for c in result["choices"]],
                _token_usage(result["usage"]))
        except _MALFORMED as exc:
            raise _unavailable(worker, exc) from exc
        _answered(exchange)
        _note_usage(exchange, body["usage"])
        return web.json_response(body)

    async def _stream_shaped(self, client: web.Request, call: Call, worker: WorkerState,
                             upstream: aiohttp.ClientResponse, exchange: Exchange,
                             translate: EventTranslator) -> web.StreamResponse:
        shape = ResponseShape(call.request.endpoint, call.model_name)
        batches = _translated(_sse_batches(upstream), translate)
        try:
            batch = await anext(batches)
        except _MALFORMED as exc:
            raise _unavailable(worker, exc) from exc
        if batch[0] is None:
            raise _unavailable(worker, EOFError("stream ended before its first event"))
        out = web.StreamResponse(headers=SSE_HEADERS)
        await out.prepare(client)
        _answered(exchange)
        try:
            while True:
                frames, ended = _client_frames(batch, shape, call.request.include_usage,
                                               exchange)
                await out.write(frames)
                if ended:
                    if exchange.status != 200:
                        log.warning("request %s: worker %s sent an error event",
                                    request_id(client), worker.worker_id)
                    return out
                batch = await anext(batches)
        except _MALFORMED as exc:
            await _end_stream_with_error(client, out, exchange, worker, exc)
        except ConnectionResetError:
            exchange.status = CLIENT_CLOSED
        return out

    async def _pass_openai(self, client: web.Request, call: Call, worker: WorkerState,
                           upstream: aiohttp.ClientResponse, exchange: Exchange
                           ) -> web.StreamResponse:
        if not call.request.stream:
            try:
                result = json.loads(await upstream.read())
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                raise _unavailable(worker, exc) from exc
            result["model"] = call.model_name
            _answered(exchange)
            _note_usage(exchange, result.get("usage"))
            return web.json_response(result)
        try:
            first = await upstream.content.readline()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unavailable(worker, exc) from exc
        if not first:
            raise _unavailable(worker, EOFError("empty stream"))
        out = web.StreamResponse(headers=SSE_HEADERS)
        await out.prepare(client)
        _answered(exchange)
        line = first
        try:
            while line:
                if line.startswith(b"data: {"):
                    if b'"choices"' in line and b'"usage"' not in line:
                        exchange.num_completion_tokens += 1  # a chunk is about one token
                    else:  # usage, or an error event: the rare lines
                        chunk = json.loads(line[6:])
                        if "error" in chunk or chunk.get("object") == "error":
                            await _end_stream_with_error(client, out, exchange, worker,
                                                         ValueError(f"error event {chunk}"))
                            return out
                        _note_usage(exchange, chunk.get("usage"))
                        if not chunk.get("choices") and not call.request.include_usage:
                            await upstream.content.readline()  # the blank line ending it
                            line = await upstream.content.readline()
                            continue
                elif line.rstrip() == b"data: [DONE]":
                    await out.write(DONE_FRAME)
                    return out
                await out.write(line)
                line = await upstream.content.readline()
            raise aiohttp.ClientPayloadError("stream ended before [DONE]")
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            await _end_stream_with_error(client, out, exchange, worker, exc)
        except ConnectionResetError:
            exchange.status = CLIENT_CLOSED
        return out


def _generate_events(batch: list[dict[str, Any] | None]) -> list[dict[str, Any] | None]:
    """A radix worker's ``/generate`` objects are the events already."""
    return batch


def _completion_events(batch: list[dict[str, Any] | None]) -> list[dict[str, Any] | None]:
    """An OpenAI-compatible backend's completions chunks as ``/generate``-style events:
    one per choice (``index``, ``text``, ``finish_reason``), a usage chunk as
    ``usage``, errors and ``[DONE]`` as they are. Chunks carry no token ids, so a cut
    stream counts one token per chunk with text (vLLM and SGLang send about one)."""
    events: list[dict[str, Any] | None] = []
    for item in batch:
        if item is None or "error" in item:
            events.append(item)
            continue
        events += [{"index": c["index"], "text": c["text"], "finish_reason": c["finish_reason"]}
                   for c in item.get("choices") or ()]
        if item.get("usage") is not None:
            events.append({"usage": item["usage"]})
    return events


async def _translated(batches: AsyncIterator[list[dict[str, Any] | None]],
                      translate: EventTranslator) -> AsyncIterator[list[dict[str, Any] | None]]:
    """``batches`` with each batch translated (empty ones are skipped)."""
    async for batch in batches:
        events = translate(batch)
        if events:
            yield events


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
            usage = _token_usage(event["usage"])
            _note_usage(exchange, usage_object(usage))
            if include_usage:
                frames.append(shape.usage_chunk(usage))
        elif "error" in event:
            code = event["error"].get("code") if isinstance(event["error"], dict) else None
            error = _worker_failed(code if isinstance(code, str) else "upstream_error")
            frames += [sse_frame(error.body()), DONE_FRAME]
            exchange.status = 502
            return b"".join(frames), True
        else:
            exchange.num_completion_tokens += len(event.get("token_ids") or event["text"][:1])
            frames.append(shape.chunk(event["index"], event["text"], event["finish_reason"]))
    return b"".join(frames), False


def _answered(exchange: Exchange) -> None:
    """The client is getting a 200 answer from now on."""
    exchange.status = 200
    exchange.first_byte_at = time.monotonic()


def _token_usage(usage: dict[str, Any]) -> TokenUsage:
    """A usage object as ``TokenUsage``: ``/generate``'s (``cached_tokens`` at the top)
    or OpenAI's (in ``prompt_tokens_details``, which a backend may leave out)."""
    cached = usage.get("cached_tokens")
    if cached is None:
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return TokenUsage(int(usage["prompt_tokens"]), int(usage["completion_tokens"]),
                      int(cached or 0))


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
        saturated = ApiError(503, "every worker is saturated; retry later", code="saturated",
                             headers={"Retry-After": RETRY_AFTER_S})
        return UpstreamUnavailable(f"{worker.worker_id}: HTTP {status}: {message}", False,
                                   saturated if status == 429 else _worker_failed())
    details = body.get("error") if isinstance(body, dict) else None
    if not isinstance(details, dict):
        return ApiError(status, message)
    upstream_param = details.get("param")
    param = request.client_param(upstream_param) if isinstance(upstream_param, str) else None
    if param is not None and param != upstream_param:
        message = message.replace(upstream_param, param, 1)
    return ApiError(status, message, param=param, code=details.get("code"))


async def _end_stream_with_error(client: web.Request, out: web.StreamResponse,
                                 exchange: Exchange, worker: WorkerState,
                                 exc: BaseException) -> None:
    """Log why the worker's stream broke; end the client's with an error event and
    ``[DONE]``."""
    log.warning("request %s: worker %s failed mid-stream: %s: %s", request_id(client),
                worker.worker_id, type(exc).__name__, exc)
    exchange.status = 502
    try:
        await out.write(sse_frame(_worker_failed().body()) + DONE_FRAME)
    except ConnectionResetError:
        exchange.status = CLIENT_CLOSED
