"""Running one request through the engine from a handler: submit, stream or collect.

Every path closes the engine stream in ``finally``: a client that disconnects
(aiohttp cancels the handler, or a write fails), a timeout, or an error all abort
the request, and the engine thread releases its blocks at its next step.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from aiohttp import web

from radix.openai.responses import DONE_FRAME, sse_frame
from workers.engine.async_engine import AsyncEngine, DrainingError, QueueFullError, RequestStream
from workers.engine.request import (
    EngineError,
    FinishReason,
    GenerationRequest,
    RequestOutput,
    UnknownAdapterError,
    Usage,
)
from workers.server.errors import ApiError, error_body


def submit(engine: AsyncEngine, request: GenerationRequest) -> RequestStream:
    """Queue ``request``; 429 (with Retry-After) when the engine is full, 503 with
    Retry-After (``draining``) once the worker drains, 503 when its thread has died."""
    try:
        return engine.submit(request)
    except QueueFullError as exc:
        raise ApiError(429, f"the worker queue is full ({exc})", code="queue_full",
                       headers={"Retry-After": "1"}) from exc
    except DrainingError as exc:
        raise ApiError(503, str(exc), code="draining", headers={"Retry-After": "1"}) from exc
    except EngineError as exc:
        raise ApiError(503, str(exc), code="engine_stopped") from exc


@dataclass
class ChoiceResult:
    """One choice accumulated over a whole request."""

    index: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None


async def collect(
    engine: AsyncEngine, request: GenerationRequest, timeout_s: float
) -> tuple[list[ChoiceResult], Usage]:
    """Run ``request`` to completion; 504 after ``timeout_s``, 404 when its LoRA
    adapter was unloaded before it was queued, 500 (``engine_error``) when it failed
    in the engine (logged there)."""
    choices = [ChoiceResult(i) for i in range(request.params.n)]
    stream = submit(engine, request)
    try:
        async with asyncio.timeout(timeout_s):
            async for output in stream:
                for delta in output.deltas:
                    choice = choices[delta.index]
                    choice.token_ids.extend(delta.token_ids)
                    choice.text += delta.text
                    choice.finish_reason = delta.finish_reason
                if output.usage is not None:
                    return choices, output.usage
    except TimeoutError as exc:
        raise ApiError(504, f"request timed out after {timeout_s:g} s", code="timeout") from exc
    except UnknownAdapterError as exc:
        raise ApiError(404, str(exc), param="model", code="model_not_found") from exc
    except EngineError as exc:
        raise ApiError(500, str(exc), code="engine_error") from exc
    finally:
        stream.close()
    raise AssertionError("the engine stream ended without usage")


class EventStream:
    """A server-sent-events response: ``data: <json>`` blocks, then ``data: [DONE]``.

    ``send`` returns False once the client is gone; the handler then stops.
    """

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self.response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )

    async def open(self) -> bool:
        """Send the headers; False when the client is already gone (then nothing more
        is sent)."""
        try:
            await self.response.prepare(self._request)
        except ConnectionError:
            return False
        return True

    async def send(self, payload: object) -> bool:
        """Send one event: a JSON value, the literal ``[DONE]``, or ``bytes`` that are
        already a whole SSE frame."""
        if isinstance(payload, bytes):
            frame = payload
        elif payload == "[DONE]":
            frame = DONE_FRAME
        else:
            frame = sse_frame(payload)
        try:
            await self.response.write(frame)
        except ConnectionError:
            return False
        return True

    async def close(self) -> web.StreamResponse:
        """Finish the response (quietly if the client already left)."""
        with contextlib.suppress(ConnectionError):
            await self.response.write_eof()
        return self.response


async def stream_response(
    request: web.Request,
    engine: AsyncEngine,
    engine_request: GenerationRequest,
    timeout_s: float,
    render: Callable[[RequestOutput], Sequence[object]],
) -> web.StreamResponse:
    """Serve ``engine_request`` as SSE: ``render(output)`` events for each engine
    output, then ``[DONE]``. A 429 comes before the headers; a timeout or
    an engine failure after them is an error event (then ``[DONE]``); a gone client
    stops it."""
    stream = submit(engine, engine_request)
    events = EventStream(request)
    try:
        if not await events.open():
            return events.response
        async with asyncio.timeout(timeout_s):
            async for output in stream:
                for payload in render(output):
                    if not await events.send(payload):
                        return events.response
        await events.send("[DONE]")
    except TimeoutError:
        await events.send(error_body(504, f"request timed out after {timeout_s:g} s", None, "timeout"))
        await events.send("[DONE]")
    except UnknownAdapterError as exc:
        await events.send(error_body(404, str(exc), "model", "model_not_found"))
        await events.send("[DONE]")
    except EngineError as exc:  # logged by the engine thread
        await events.send(error_body(500, str(exc), None, "engine_error"))
        await events.send("[DONE]")
    finally:
        stream.close()
    return await events.close()
