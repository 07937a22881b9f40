"""The client side of one shaped request, across every attempt that serves it.

A ``Relay`` turns ``/generate``-style events (``index``, ``token_ids``, ``text``,
``finish_reason``; a ``usage`` event; ``error`` events; ``None`` for ``[DONE]``) into
the client's OpenAI answer: SSE chunks as they come for a stream, one JSON body at the
end otherwise. It keeps the request's ``Progress`` (what each choice has delivered),
so that when a worker fails the next attempt can resume where it stopped: with the
prompt plus the delivered token ids and ``num_resumed_tokens`` (the worker then counts
them as completion tokens and sends none of their text again), so the client's text is
that of one uninterrupted run and its ``usage`` counts the original prompt and every
completion token.

Resume needs one choice and token ids on every event (radix workers send them):
``n > 1`` and ``openai`` workers' streams are not resumed after the client's first
byte; the stream then ends with an error event and ``[DONE]``. Before the first byte
(always, for a whole answer) a request that cannot resume starts over elsewhere.
"""

from __future__ import annotations

import base64
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from radix.keys import to_key
from radix.openai.responses import (
    DONE_FRAME,
    ChoiceText,
    ResponseShape,
    TokenUsage,
    sse_frame,
    usage_object,
)
from router.upstream.attempt import Batch, worker_failed

CLIENT_CLOSED = 499  # the client went away (nginx's convention)
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass
class Exchange:
    """What happened: the status the client got, completion tokens sent to the client
    (counted as they stream; the worker's final usage when it arrives), tokens the
    worker found cached, and when the first byte reached the client (monotonic
    seconds). The caller creates it; the relay fills it in."""

    status: int
    num_completion_tokens: int = 0
    num_cached_tokens: int | None = None
    first_byte_at: float | None = None


@dataclass
class ChoiceProgress:
    """What one choice has delivered: token ids, text, and its finish reason."""

    token_ids: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    finish_reason: str | None = None


class Progress:
    """Every choice's delivered output. ``token_ids_known`` turns False at the first
    event without token ids (an ``openai`` worker's), which rules out resuming."""

    def __init__(self, num_choices: int) -> None:
        self.choices = [ChoiceProgress() for _ in range(num_choices)]
        self.token_ids_known = True

    def note(self, event: dict[str, Any]) -> None:
        """Add one delta event."""
        choice = self.choices[event["index"]]
        token_ids = event.get("token_ids")
        if token_ids is None:
            self.token_ids_known = False
        else:
            choice.token_ids.extend(token_ids)
        choice.text.append(event["text"])
        choice.finish_reason = event["finish_reason"] or choice.finish_reason

    @property
    def resumable(self) -> bool:
        """One choice, every token id known: a later attempt can continue it."""
        return len(self.choices) == 1 and self.token_ids_known

    @property
    def finished(self) -> bool:
        """Every choice has its finish reason (only usage and ``[DONE]`` are missing)."""
        return all(c.finish_reason is not None for c in self.choices)

    @property
    def num_tokens(self) -> int:
        """Completion tokens delivered over all choices."""
        return sum(len(c.token_ids) for c in self.choices)

    def resumed_prompt(self, prompt_key: bytes) -> tuple[bytes, int]:
        """The prompt key for the next attempt (``prompt_key`` plus the delivered token
        ids of a resumable request) and how many of its tokens are resumed output."""
        if not self.resumable or not self.choices[0].token_ids:
            return prompt_key, 0
        delivered = self.choices[0].token_ids
        return prompt_key + to_key(delivered), len(delivered)


def resumed_generate_body(body: dict[str, Any], prompt_key: bytes, progress: Progress
                          ) -> dict[str, Any]:
    """``/generate`` body ``body`` continued from ``progress`` (unchanged when nothing
    was delivered): the worker counts ``num_resumed_tokens`` toward ``max_tokens``."""
    key, num_resumed = progress.resumed_prompt(prompt_key)
    if not num_resumed:
        return body
    return {**body, "token_ids_b64": base64.b64encode(key).decode(),
            "num_resumed_tokens": num_resumed}


class Relay:
    """One request's answer to its client. ``started`` once the client got a byte
    (only streams start before the end); ``prepare_attempt(kind)`` says whether an
    attempt on a worker of that kind may go on from here (dropping progress if it
    must start over)."""

    def __init__(self, client: web.Request, shape: ResponseShape, stream: bool,
                 include_usage: bool, num_choices: int, num_prompt_tokens: int) -> None:
        self._client = client
        self._shape = shape
        self._stream = stream
        self._include_usage = include_usage
        self._num_prompt_tokens = num_prompt_tokens
        self.progress = Progress(num_choices)
        self.response: web.StreamResponse | None = None
        self._usage: TokenUsage | None = None

    @property
    def started(self) -> bool:
        """The client has received bytes: the answer can only go on or end."""
        return self.response is not None and self.response.prepared

    def prepare_attempt(self, kind: str) -> bool:
        """Whether a ``kind`` worker may take over now. Before the first byte any may:
        progress that it cannot continue is dropped and the request starts over."""
        resumable = kind == "radix" and self.progress.resumable
        if not self.started:
            if not resumable:
                self.progress = Progress(len(self.progress.choices))
            return True
        return resumable

    async def write(self, batch: Batch, exchange: Exchange) -> bool:
        """Relay one batch of events; True when the answer is over: ``[DONE]``, an
        error event (which ends a stream with a 502 error event; for a whole answer it
        raises ``ValueError``, a failed attempt), or a client that went away."""
        frames: list[bytes] = []
        for event in batch:
            if event is None:
                if not any(c.text for c in self.progress.choices):
                    raise ValueError("the stream ended before its first event")
                return await self._end(frames, exchange)
            if "usage" in event:
                self._usage = token_usage(event["usage"])
                note_usage(exchange, usage_object(self._usage))
                if self._include_usage:
                    frames.append(self._shape.usage_chunk(self._usage))
            elif "error" in event:
                error = event["error"]
                code = error.get("code") if isinstance(error, dict) else None
                if not self._stream:
                    raise ValueError(f"the worker sent an error event ({code})")
                await self._send(b"".join(frames), exchange)
                await self.fail(exchange, code if isinstance(code, str) else "upstream_error")
                return True
            else:
                self.progress.note(event)
                exchange.num_completion_tokens += len(event.get("token_ids") or event["text"][:1])
                if self._stream:
                    frames.append(self._shape.chunk(event["index"], event["text"],
                                                    event["finish_reason"]))
        if self._stream:
            await self._send(b"".join(frames), exchange)
        return exchange.status == CLIENT_CLOSED

    async def finish(self, exchange: Exchange) -> None:
        """Complete an answer whose choices all finished although the worker died
        before its usage: usage from the delivered tokens (cached: unknown, 0)."""
        self._usage = TokenUsage(self._num_prompt_tokens, self.progress.num_tokens, 0)
        note_usage(exchange, usage_object(self._usage))
        frames = [self._shape.usage_chunk(self._usage)] if self._include_usage else []
        await self._end(frames, exchange)

    async def fail(self, exchange: Exchange, code: str = "upstream_error") -> None:
        """End a started stream with an error event and ``[DONE]`` (status 502)."""
        assert self._stream, "a whole answer fails before its first byte"
        await self._send(sse_frame(worker_failed(code).body()) + DONE_FRAME, exchange)
        exchange.status = 502 if exchange.status != CLIENT_CLOSED else CLIENT_CLOSED

    async def _end(self, frames: list[bytes], exchange: Exchange) -> bool:
        if self._stream:
            await self._send(b"".join(frames) + DONE_FRAME, exchange)
            return True
        choices = [ChoiceText(i, "".join(c.text), c.finish_reason)
                   for i, c in enumerate(self.progress.choices)]
        usage = self._usage or TokenUsage(self._num_prompt_tokens, self.progress.num_tokens, 0)
        self.response = web.json_response(self._shape.whole(choices, usage))
        answered(exchange)
        return True

    async def _send(self, data: bytes, exchange: Exchange) -> None:
        if self.response is None:
            self.response = web.StreamResponse(headers=SSE_HEADERS)
            await self.response.prepare(self._client)
            answered(exchange)
        if exchange.status == CLIENT_CLOSED or not data:
            return
        try:
            await self.response.write(data)
        except ConnectionResetError:
            exchange.status = CLIENT_CLOSED


def answered(exchange: Exchange) -> None:
    """The client is getting a 200 answer from now on."""
    exchange.status = 200
    exchange.first_byte_at = time.monotonic()


def token_usage(usage: dict[str, Any]) -> TokenUsage:
    """A usage object as ``TokenUsage``: ``/generate``'s (``cached_tokens`` at the top)
    or OpenAI's (in ``prompt_tokens_details``, which a backend may leave out)."""
    cached = usage.get("cached_tokens")
    if cached is None:
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return TokenUsage(int(usage["prompt_tokens"]), int(usage["completion_tokens"]),
                      int(cached or 0))


def note_usage(exchange: Exchange, usage: Any) -> None:
    """Copy completion and cached token counts from an OpenAI ``usage`` object."""
    if isinstance(usage, dict):
        exchange.num_completion_tokens = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            exchange.num_cached_tokens = int(details["cached_tokens"])
