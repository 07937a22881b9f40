"""The client side of one request, across every attempt that serves it.

A radix worker renders the client's answer itself (``radix.openai.rendered``: the
router sends the ``id``, ``created`` and model name, the same on every attempt); the
``Relay`` copies its ``data`` lines to the client byte for byte, a stream's as they
come, a whole answer's body at the end, and reads only the ``tokens`` lines (the
generated token ids of each step) and the ``usage`` line. An ``openai`` worker's
chat stream comes as ``/generate``-style events (``index``, ``text``,
``finish_reason``; ``usage``; ``error``; ``None`` for ``[DONE]``) that the relay shapes
into chat chunks with the shared ``ResponseShape``.

The relay keeps the request's ``Progress`` (what each choice has delivered, committed
per complete SSE event: a step counts once the blank line after its ``data`` line
has arrived, and only then is its text written to the client), so that
when a worker fails the next attempt can resume where it stopped: with the prompt
plus the delivered token ids and ``num_resumed_tokens`` (the worker then counts them
as completion tokens, sends none of their text again, and starts a whole body with
it), so the client's answer is that of one uninterrupted run and its ``usage`` counts
the original prompt and every completion token.

Resume needs one choice and token ids on every step (radix workers send them):
``n > 1`` and ``openai`` workers' streams are not resumed after the client's first
byte; the stream then ends with an error event and ``[DONE]``. Before the first byte
(always, for a whole answer) a request that cannot resume starts over elsewhere, as
does a whole answer whose choices all finished without its body arriving.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from radix.generate import GenerateRequest
from radix.keys import to_key
from radix.openai.rendered import (
    ANSWER_PREFIX,
    DATA_PREFIX,
    TOKENS_PREFIX,
    USAGE_PREFIX,
    RenderSpec,
    parse_usage,
)
from radix.openai.responses import DONE_FRAME, ResponseShape, TokenUsage, sse_frame
from router.client import JSON_HEADERS, Client
from router.forward.attempt import Batch, worker_failed

CLIENT_CLOSED = 499  # the client went away (nginx's convention)
_DONE_LINE = b"data: [DONE]"
_DONE: dict[str, Any] = {}  # the end of a rendered stream (``_end_event``)


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
    """What one choice has delivered: token ids and its finish reason."""

    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None


class Progress:
    """Every choice's delivered output. ``token_ids_known`` turns False at the first
    step without token ids (an ``openai`` worker's), which rules out resuming."""

    def __init__(self, num_choices: int) -> None:
        self.choices = [ChoiceProgress() for _ in range(num_choices)]
        self.token_ids_known = True
        self.num_steps = 0

    def note(self, index: int, token_ids: list[int] | None, finish_reason: str | None) -> None:
        """Add one step of choice ``index``."""
        choice = self.choices[index]
        self.num_steps += 1
        if token_ids is None:
            self.token_ids_known = False
        else:
            choice.token_ids.extend(token_ids)
        choice.finish_reason = finish_reason or choice.finish_reason

    def note_steps(self, steps: list[dict[str, Any]]) -> int:
        """Add the steps of a rendered stream (``tokens`` objects: ``index``,
        ``token_ids``, ``finish_reason``); the number of token ids they carry."""
        choices = self.choices
        num_tokens = 0
        for step in steps:
            choice = choices[step["index"]]
            token_ids = step["token_ids"]
            choice.token_ids.extend(token_ids)
            num_tokens += len(token_ids)
            choice.finish_reason = step["finish_reason"] or choice.finish_reason
        self.num_steps += len(steps)
        return num_tokens

    @property
    def resumable(self) -> bool:
        """One unfinished choice, every token id known: a later attempt can continue it."""
        return len(self.choices) == 1 and self.token_ids_known and not self.finished

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
        if not self.choices[0].token_ids or not self.resumable:
            return prompt_key, 0
        delivered = self.choices[0].token_ids
        return prompt_key + to_key(delivered), len(delivered)

    def resumed(self, request: GenerateRequest) -> GenerateRequest:
        """``request`` continued from here (unchanged when nothing was delivered): the
        worker counts the resumed tokens toward ``max_tokens``."""
        key, num_resumed = self.resumed_prompt(request.prompt_key)
        return request.resumed(key, num_resumed) if num_resumed else request


class Relay:
    """One request's answer to its client. ``started`` once the client got a byte
    (only streams start before the end); ``prepare_attempt`` says whether an
    attempt on a worker that does or does not resume may go on from here (dropping progress if it
    must start over); the current attempt's ``on_first_token`` is called as each of
    its steps arrives (it must be cheap and idempotent)."""

    def __init__(self, client: Client, shape: ResponseShape, stream: bool,
                 include_usage: bool, num_choices: int, num_prompt_tokens: int,
                 write_timeout_s: float) -> None:
        self._client = client
        self._write_budget_s = write_timeout_s
        self._shape = shape
        self._stream = stream
        self._include_usage = include_usage
        self._num_prompt_tokens = num_prompt_tokens
        self.render = RenderSpec.of(shape, stream, include_usage)
        self.progress = Progress(num_choices)
        self._whole_body: bytes | None = None
        self._event_step: dict[str, Any] | None = None
        self._event_out: list[bytes] = []
        self.on_first_token: Callable[[], None] = _nothing

    @property
    def started(self) -> bool:
        """The client has received bytes: the answer can only go on or end."""
        return self._client.started

    @property
    def can_finish(self) -> bool:
        """A stream whose choices all finished, although its worker died before the
        usage: ``finish`` completes it."""
        return self._stream and self.progress.finished

    def prepare_attempt(self, worker_resumes: bool) -> bool:
        """Whether a worker may take over now (``worker_resumes``: its kind can go on
        from delivered tokens). Before the first byte any may: progress that it cannot
        continue is dropped and the request starts over."""
        self._event_step, self._event_out = None, []
        if not self.started:  # a progress without steps is as good as a new one
            if self.progress.num_steps and not (worker_resumes and self.progress.resumable):
                self.progress = Progress(len(self.progress.choices))
            return True
        return worker_resumes and self.progress.resumable

    async def write_rendered(self, lines: list[bytes], exchange: Exchange) -> bool:
        """Relay the complete lines of one network read of a rendered stream, a step
        (its ``tokens`` line and its ``data`` line) only once the blank line ending its
        event has arrived; True when the answer is over: ``[DONE]``, an error event
        (which ends a stream with a 502 error event; for a whole answer it raises
        ``ValueError``, a failed attempt), or a client that went away. The ``data``
        lines are copied, not parsed; the read's complete steps count as delivered
        (``progress``, the exchange's tokens) together, as their bytes go out: a
        malformed line anywhere in the read fails the attempt with neither."""
        out: list[bytes] = []
        steps: list[dict[str, Any]] = []
        usage: TokenUsage | None = None
        end: dict[str, Any] | None = None
        for line in lines:
            if line.startswith(TOKENS_PREFIX):
                self._event_step = orjson.loads(line[len(TOKENS_PREFIX):])
            elif line.startswith(ANSWER_PREFIX):
                if self._stream:
                    self._event_out.append(line.rstrip() + b"\n\n")
                else:
                    self._whole_body = line[len(DATA_PREFIX):].rstrip()
            elif not line.strip():  # the blank line that ends an event
                if self._event_step is not None:
                    steps.append(self._event_step)
                out += self._event_out
                self._event_step, self._event_out = None, []
            elif line.startswith(DATA_PREFIX):
                end = _end_event(line, usage is not None or exchange.num_cached_tokens is not None)
                break
            elif line.startswith(USAGE_PREFIX):
                usage = parse_usage(line)
        if steps or self._event_step is not None:
            self.on_first_token()
        self._deliver(steps, usage, exchange)
        if end is not None:
            return await (self._end_rendered(out, exchange) if end is _DONE
                          else self._worker_error(end, out, exchange))
        if out:
            await self.send(b"".join(out), exchange)
        return exchange.status == CLIENT_CLOSED

    def _deliver(self, steps: list[dict[str, Any]], usage: TokenUsage | None,
                 exchange: Exchange) -> None:
        """Count ``steps`` (each event's ``tokens``) as delivered, then take the
        worker's final ``usage`` if it came."""
        if steps:
            exchange.num_completion_tokens += self.progress.note_steps(steps)
        if usage is not None:
            note_token_usage(exchange, usage)

    async def write(self, batch: Batch, exchange: Exchange) -> bool:
        """Relay one batch of an ``openai`` worker's chat stream events, shaped into
        chat chunks; True when the answer is over (as ``write_rendered``)."""
        assert self._stream, "whole answers of openai workers are not relayed"
        frames: list[bytes] = []
        self.on_first_token()
        for event in batch:
            if event is None:
                if not self.progress.num_steps:
                    raise ValueError("the stream ended before its first event")
                await self.send(b"".join(frames) + DONE_FRAME, exchange)
                return True
            if "usage" in event:
                usage = token_usage(event["usage"])
                note_usage(exchange, event["usage"])  # cached_tokens as reported, or None
                if self._include_usage:
                    frames.append(self._shape.usage_chunk(usage))
            elif "error" in event:
                return await self._worker_error(event, frames, exchange)
            else:
                self.progress.note(event["index"], None, event["finish_reason"])
                exchange.num_completion_tokens += len(event["text"][:1])
                frames.append(self._shape.chunk(event["index"], event["text"],
                                                event["finish_reason"]))
        await self.send(b"".join(frames), exchange)
        return exchange.status == CLIENT_CLOSED

    async def finish(self, exchange: Exchange) -> None:
        """Complete a stream whose choices all finished although the worker died before
        its usage: usage from the delivered tokens (cached: unknown, 0 to the client and
        None in ``exchange``, so no prediction is checked against it)."""
        usage = TokenUsage(self._num_prompt_tokens, self.progress.num_tokens, 0)
        exchange.num_completion_tokens = usage.completion_tokens
        frames = self._shape.usage_chunk(usage) if self._include_usage else b""
        await self.send(frames + DONE_FRAME, exchange)

    async def fail(self, exchange: Exchange, code: str = "upstream_error") -> None:
        """End a started stream with an error event and ``[DONE]`` (status 502)."""
        assert self._stream, "a whole answer fails before its first byte"
        await self.send(sse_frame(worker_failed(code).body()) + DONE_FRAME, exchange)
        exchange.status = 502 if exchange.status != CLIENT_CLOSED else CLIENT_CLOSED

    async def _worker_error(self, event: dict[str, Any], frames: list[bytes],
                            exchange: Exchange) -> bool:
        error = event["error"]
        code = error.get("code") if isinstance(error, dict) else None
        if not self._stream:
            raise ValueError(f"the worker sent an error event ({code})")
        await self.send(b"".join(frames), exchange)
        await self.fail(exchange, code if isinstance(code, str) else "upstream_error")
        return True

    async def _end_rendered(self, out: list[bytes], exchange: Exchange) -> bool:
        if self._stream:
            await self.send(b"".join(out) + DONE_FRAME, exchange)
            return True
        if self._whole_body is None:
            raise ValueError("the stream ended without its body")
        self._client.respond(200, self._whole_body, JSON_HEADERS)
        answered(exchange)
        return True

    async def send(self, data: bytes, exchange: Exchange) -> None:
        """Write ``data`` to the client, starting its stream first if need be. The
        writes of one answer may wait ``write_timeout_s`` in all: a client gone, or
        one that does not read the answer in that time (its connection is then
        dropped), marks the exchange ``CLIENT_CLOSED``, and the caller stops, closing
        the upstream and its in-flight count."""
        if not self._client.started:
            await self._client.start_stream()
            answered(exchange)
        if exchange.status == CLIENT_CLOSED or not data:
            return
        started = time.monotonic()
        try:
            await self._client.write(data, max(self._write_budget_s, 1e-3))
        except ConnectionResetError:
            exchange.status = CLIENT_CLOSED
        except TimeoutError:
            exchange.status = CLIENT_CLOSED
            self._client.abort()
        self._write_budget_s -= time.monotonic() - started


def _nothing() -> None:
    """No attempt is listening for tokens."""


def _end_event(line: bytes, has_usage: bool) -> dict[str, Any]:
    """What a rendered stream's ``data`` line that is not an answer says: ``_DONE``
    (after the usage line), or the worker's error event; ``ValueError`` for
    anything else."""
    line = line.rstrip()
    if line == _DONE_LINE:
        if not has_usage:
            raise ValueError("the stream ended before its usage")
        return _DONE
    event = orjson.loads(line[len(DATA_PREFIX):])
    if not isinstance(event, dict) or "error" not in event:
        raise ValueError("a data line that is neither answer nor error")
    return event


def answered(exchange: Exchange) -> None:
    """The client is getting a 200 answer from now on."""
    exchange.status = 200
    exchange.first_byte_at = time.monotonic()


def token_usage(usage: dict[str, Any]) -> TokenUsage:
    """An OpenAI ``usage`` object as ``TokenUsage`` (``cached_tokens`` in
    ``prompt_tokens_details``, which a backend may leave out)."""
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return TokenUsage(int(usage["prompt_tokens"]), int(usage["completion_tokens"]),
                      int(cached or 0))


def note_token_usage(exchange: Exchange, usage: TokenUsage) -> None:
    """Take completion and cached token counts from the worker's final usage."""
    exchange.num_completion_tokens = usage.completion_tokens
    exchange.num_cached_tokens = usage.cached_tokens


def note_usage(exchange: Exchange, usage: Any) -> None:
    """Copy completion and cached token counts from an OpenAI ``usage`` object."""
    if isinstance(usage, dict):
        exchange.num_completion_tokens = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and details.get("cached_tokens") is not None:
            exchange.num_cached_tokens = int(details["cached_tokens"])
