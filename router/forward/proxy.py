"""What each kind of worker is sent and how its answer reaches the client, streamed
through without buffering (the HTTP exchange under it, its timeouts and failures,
are ``router.forward.attempt``'s).

Workers that speak ``/generate`` (``radix``) get ``POST /generate`` as a stream,
also for a whole answer (the prompt as ``token_ids_b64``: its key in base64, much
cheaper than a JSON id list; scope, ``num_public_tokens``, sampling, ``render``, the
LoRA ``adapter`` if any, and ``num_resumed_tokens`` when an attempt continues a
failed one); they render the client's OpenAI bytes themselves and the request's
``Relay`` (``router.forward.relay``) passes them through. The others (``vllm``,
``openai``) get ``/v1/completions`` with the validated fields only
(``OpenAIRequest.upstream_body``: the adapter's name as the model for a LoRA
request, the router's token ids as the prompt, chat messages rendered by the router
with content as text, the tenant's ``cache_salt``); completions answers pass
through, chat requests' answers are reshaped into chat objects like a radix
worker's.

Contract of ``Proxy.send``: either it answers the client (whole or streamed), filling
in the caller's ``Exchange`` as it goes, or it raises ``UpstreamUnavailable``; the
relay then says whether the client got bytes and whether another worker may go on
(``Relay.prepare_attempt``). A completions stream passed through that
fails after its first byte (a broken connection, a timeout, the backend's own error
event, an end without ``[DONE]``) ends with our error event and then ``data: [DONE]``
itself. A client that goes away closes the upstream response, which cancels the
request on the worker; the exchange then holds the completion tokens streamed so
far, which is what the tenant is charged. Timeouts are ``router.forward.attempt``'s.

Errors sent to clients name no worker address and no exception text: the detail is
logged under the request id (``router.server.request_ids``). An ``openai`` backend's
4xx is the router's own error with the same status (``router.forward.masking``), and
its streamed chunks carry the router's model name, never the backend's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import orjson

from radix.api_errors import ApiError
from radix.generate import PATH as GENERATE_PATH
from radix.generate import GenerateRequest
from radix.kv_transfer import RELEASE_PATH
from radix.openai.rendered import RenderSpec
from radix.openai.requests import COMPLETIONS, OpenAIRequest
from radix.openai.responses import DONE_FRAME, ChoiceText, ResponseShape, sse_frame
from router.client import Client
from router.config import ProxyConfig
from router.fleet.registry import WorkerState
from router.forward.attempt import (
    MALFORMED,
    Batch,
    Upstream,
    UpstreamUnavailable,
    unavailable,
    worker_failed,
)
from router.forward.masking import refusal
from router.forward.passthrough import CompletionPassthrough
from router.forward.pool import UpstreamError, UpstreamPool, UpstreamResponse
from router.forward.relay import (
    CLIENT_CLOSED,
    Exchange,
    Relay,
    answered,
    note_usage,
    token_usage,
)
from router.models import Prompt

log = logging.getLogger(__name__)
RELEASE_TIMEOUT_S = 5.0
# A prefill leg's answer: one token's completion plus its kv_transfer_params, which
# name at most one block id and hash (under 64 bytes as JSON) per prompt token.
PREFILL_ANSWER_BASE_BYTES = 64 * 1024
PREFILL_ANSWER_BYTES_PER_TOKEN = 96


@dataclass(frozen=True)
class Call:
    """What to run, independent of which worker runs it: ``model_name`` is the name the
    client asked for (the adapter's, for a LoRA request), ``adapter`` the LoRA adapter
    (None for the base model); ``session_id`` and ``retention_s`` the agent session it
    belongs to and how long its context should be kept (``router.routing.sessions``)."""

    request: OpenAIRequest
    model_name: str
    prompt: Prompt
    scope: str
    max_tokens: int | None
    cache_salt: str
    max_cached_tokens: int | None = None
    request_id: str | None = None
    adapter: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    session_id: str | None = None
    retention_s: float | None = None


def generate_request(call: Call, render: RenderSpec) -> GenerateRequest:
    """The ``/generate`` request of ``call``, rendered as ``render`` says (always
    streamed: a whole answer's body comes at the end, so it resumes like a stream)."""
    sampling = call.request.sampling
    if sampling.max_tokens != call.max_tokens:
        sampling = replace(sampling, max_tokens=call.max_tokens)
    return GenerateRequest(
        call.prompt.key, call.scope, sampling, stream=True, render=render,
        num_public_tokens=call.prompt.num_public_tokens,
        max_cached_tokens=call.max_cached_tokens, request_id=call.request_id,
        adapter=call.adapter, kv_transfer_params=call.kv_transfer_params,
        priority=call.request.priority, session_id=call.session_id,
        retention_s=call.retention_s)


class Proxy:
    """Sends attempts over the keep-alive connections of an ``UpstreamPool``."""

    def __init__(self, pool: UpstreamPool, config: ProxyConfig) -> None:
        self._upstream = Upstream(pool, config)
        self._pool = pool
        self._write_timeout_s = config.client_write_timeout_s
        self._releases: set[asyncio.Task[None]] = set()

    def release_hold(self, worker: WorkerState | None, params: dict[str, Any]) -> None:
        """Tell prefill worker ``worker`` to end the hold of ``params`` now (their decode
        attempt failed or its client hung up: nobody will pull them, or the decode
        worker has and acknowledged already, and then this changes nothing). Runs in a
        task of its own, at most ``RELEASE_TIMEOUT_S``, so it is safe while the caller
        is being cancelled; a failure is logged (the worker's hold deadline ends the
        hold then). Nothing for None."""
        if worker is None:
            return
        task = asyncio.get_running_loop().create_task(self._release(worker, params))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _release(self, worker: WorkerState, params: dict[str, Any]) -> None:
        body = orjson.dumps({"remote_request_id": params.get("remote_request_id")})
        try:
            async with asyncio.timeout(RELEASE_TIMEOUT_S):
                response = await self._pool.post(worker.url, RELEASE_PATH, worker.headers,
                                                  body)
                try:
                    await response.read()
                finally:
                    response.close()
        except (UpstreamError, TimeoutError, OSError) as exc:
            log.info("could not release hold %s on %s: %s", params.get("remote_request_id"),
                     worker.worker_id, exc)

    def relay(self, client: Client, call: Call) -> Relay:
        """The client side of ``call``, shared by all its attempts."""
        request = call.request
        return Relay(client, ResponseShape(request.endpoint, call.model_name), request.stream,
                     request.include_usage, request.sampling.n, len(call.prompt.token_ids),
                     self._write_timeout_s)

    async def send(self, client: Client, call: Call, relay: Relay, worker: WorkerState,
                   exchange: Exchange) -> None:
        """Run ``call`` on ``worker`` (from where ``relay`` stands); see the module
        docstring for the contract."""
        try:
            if worker.capabilities.speaks_generate:
                await self._relay_generate(call, relay, worker, exchange)
            elif call.request.endpoint == COMPLETIONS:
                await self._pass_openai(client, call, relay, worker, exchange)
            elif call.request.stream:
                await self._relay_openai_chat(call, relay, worker, exchange)
            else:
                await self._whole_openai_chat(client, call, worker, exchange)
        except UpstreamUnavailable as exc:
            log.warning("request %s: worker unavailable%s: %s", client.request_id,
                        " mid-stream" if relay.started else "", exc)
            raise
        except ApiError as exc:
            if not relay.started and worker.capabilities.masks_answers:
                log.info("request %s: worker %s refused: HTTP %d: %s", client.request_id,
                         worker.worker_id, exc.status, exc.message)
                raise refusal(exc) from None
            if not relay.started:
                raise
            # A refused resume (a bug on one side): the client has its stream already.
            log.error("request %s: worker %s refused a resume: %s", client.request_id,
                      worker.worker_id, exc)
            raise UpstreamUnavailable(str(exc), False, worker_failed()) from exc

    async def prefill(self, call: Call, worker: WorkerState) -> dict[str, Any]:
        """Run ``call``'s prefill leg on ``worker`` (a ``kv_producer``: one token, not
        streamed, ``do_remote_decode``) and return the ``kv_transfer_params`` its answer
        carries for the decode leg; ``UpstreamUnavailable`` or ``ApiError`` when it
        fails or its answer is longer than such an answer can be (bounded by the
        prompt's length, read no further), ``UpstreamError`` when it carries none."""
        request = GenerateRequest(
            call.prompt.key, call.scope, replace(call.request.sampling, max_tokens=1, n=1),
            num_public_tokens=call.prompt.num_public_tokens,
            max_cached_tokens=call.max_cached_tokens, request_id=call.request_id,
            kv_transfer_params={"do_remote_decode": True}, priority=call.request.priority)
        upstream = await self._upstream.post(worker, GENERATE_PATH, request.to_json(),
                                             call.request)
        max_bytes = (PREFILL_ANSWER_BASE_BYTES
                     + PREFILL_ANSWER_BYTES_PER_TOKEN * len(call.prompt.token_ids))
        try:
            answer = orjson.loads(await read_bounded(upstream, max_bytes))
        except MALFORMED as exc:
            raise unavailable(worker, exc) from exc
        finally:
            upstream.close()
        params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        if not isinstance(params, dict):
            raise UpstreamError(f"worker {worker.worker_id}'s prefill answer has no "
                                f"kv_transfer_params (is it a kv_producer?)")
        return params

    async def _relay_generate(self, call: Call, relay: Relay, worker: WorkerState,
                              exchange: Exchange) -> None:
        request = relay.progress.resumed(generate_request(call, relay.render))
        upstream = await self._upstream.post(worker, GENERATE_PATH, request.to_json(),
                                             call.request)
        await self._relay_stream(worker, upstream, exchange,
                                 self._upstream.line_batches(upstream), relay.write_rendered)

    async def _relay_openai_chat(self, call: Call, relay: Relay, worker: WorkerState,
                                 exchange: Exchange) -> None:
        path, body = self._openai_body(call, worker)
        upstream = await self._upstream.post(worker, path, body, call.request)

        async def write(batch: Batch, exchange: Exchange) -> bool:
            events = _completion_events(batch)
            return bool(events) and await relay.write(events, exchange)

        await self._relay_stream(worker, upstream, exchange, self._upstream.sse_batches(upstream),
                                 write)

    @staticmethod
    async def _relay_stream(worker: WorkerState, upstream: UpstreamResponse,
                            exchange: Exchange, batches: AsyncIterator[Any],
                            write: Callable[[Any, Exchange], Awaitable[bool]]) -> None:
        """Write each batch of ``upstream`` through the relay until the answer is over;
        a broken or malformed stream is a failed attempt."""
        try:
            async for batch in batches:
                if await write(batch, exchange):
                    if exchange.status == 502:
                        log.warning("worker %s sent an error event", worker.worker_id)
                    return
        except MALFORMED as exc:
            raise unavailable(worker, exc) from exc
        finally:
            upstream.close()
        raise AssertionError("a stream ends with [DONE] or raises")

    @staticmethod
    def _openai_body(call: Call, worker: WorkerState) -> tuple[str, bytes]:
        path, body = call.request.upstream_body(call.adapter or worker.served_model,
                                                call.max_tokens, call.prompt.token_ids,
                                                call.cache_salt)
        return path, orjson.dumps(body)

    async def _whole_openai_chat(self, client: Client, call: Call, worker: WorkerState,
                                 exchange: Exchange) -> None:
        path, body = self._openai_body(call, worker)
        upstream = await self._upstream.post(worker, path, body, call.request)
        try:
            result = orjson.loads(await upstream.read())
            shaped = ResponseShape(call.request.endpoint, call.model_name).whole(
                [ChoiceText(c["index"], c["text"], c["finish_reason"])
                 for c in result["choices"]],
                token_usage(result["usage"]))
        except MALFORMED as exc:
            raise unavailable(worker, exc) from exc
        finally:
            upstream.close()
        answered(exchange)
        note_usage(exchange, result["usage"])  # cached_tokens as reported, or None
        client.respond_json(200, shaped)

    async def _pass_openai(self, client: Client, call: Call, relay: Relay,
                           worker: WorkerState, exchange: Exchange) -> None:
        path, body = self._openai_body(call, worker)
        upstream = await self._upstream.post(worker, path, body, call.request)
        try:
            if not call.request.stream:
                try:
                    result = orjson.loads(await upstream.read())
                except MALFORMED as exc:
                    raise unavailable(worker, exc) from exc
                result["model"] = call.model_name
                answered(exchange)
                note_usage(exchange, result.get("usage"))
                client.respond_json(200, result)
                return
            batches = self._upstream.line_batches(upstream)
            try:
                first = await anext(batches)
            except MALFORMED as exc:
                raise unavailable(worker, exc) from exc
            await relay.send(b"", exchange)  # the stream's head
            await self._pass_lines(client, call, relay, worker, first, batches, exchange)
        finally:
            upstream.close()

    @staticmethod
    async def _pass_lines(client: Client, call: Call, relay: Relay, worker: WorkerState,
                          lines: list[bytes], batches: AsyncIterator[list[bytes]],
                          exchange: Exchange) -> None:
        """Copy an OpenAI completions stream to the client up to its ``[DONE]``, one
        write per network read (``router.forward.passthrough``: the router's model
        name, usage noted, a usage-only chunk the client did not ask for left out). A
        backend's own error event, or an end without ``[DONE]``, is a failure: the
        client gets what came before it, then our error event and ``[DONE]``."""
        stream = CompletionPassthrough(call.model_name, call.adapter or worker.served_model,
                                       call.request.include_usage)
        out: list[bytes] = []
        try:
            while True:
                done = stream.feed(lines, out, exchange)
                await relay.send(b"".join(out), exchange)
                if done or exchange.status == CLIENT_CLOSED:
                    return
                out = []
                lines = await anext(batches)
        except MALFORMED as error:
            exc: BaseException = error
        log.warning("request %s: worker %s failed mid-stream: %s: %s", client.request_id,
                    worker.worker_id, type(exc).__name__, exc)
        exchange.status = 502
        await relay.send(b"".join(out) + sse_frame(worker_failed().body()) + DONE_FRAME,
                         exchange)


async def read_bounded(upstream: UpstreamResponse, max_bytes: int) -> bytes:
    """The rest of ``upstream``'s body; ``UpstreamError`` as soon as it passes
    ``max_bytes`` (nothing past the chunk that crossed it is read)."""
    parts: list[bytes] = []
    num_bytes = 0
    while data := await upstream.readany():
        num_bytes += len(data)
        if num_bytes > max_bytes:
            raise UpstreamError(f"the answer is over {max_bytes} bytes")
        parts.append(data)
    return b"".join(parts)


def _completion_events(batch: Batch) -> Batch:
    """An OpenAI-compatible backend's completions chunks as ``/generate``-style events:
    one per choice (``index``, ``text``, ``finish_reason``), a usage chunk as
    ``usage``, errors and ``[DONE]`` as they are. Chunks carry no token ids, so a cut
    stream counts one token per chunk with text (vLLM and SGLang send about one), and
    cannot be resumed."""
    events: Batch = []
    for item in batch:
        if item is None or "error" in item:
            events.append(item)
            continue
        events += [{"index": c["index"], "text": c["text"], "finish_reason": c["finish_reason"]}
                   for c in item.get("choices") or ()]
        if item.get("usage") is not None:
            events.append({"usage": item["usage"]})
    return events
