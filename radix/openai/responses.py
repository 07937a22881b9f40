"""OpenAI completions and chat objects, whole and as SSE stream chunks.

One shape for both sides: the worker renders its engine's results with it and the
router renders a radix worker's ``/generate`` results with it, so a client sees the
same bytes' structure from either. Streams: one chunk per choice per step that has
text or a finish reason (a chat choice's first chunk carries ``"role":
"assistant"``; a chat chunk without text has an empty ``delta`` apart from that),
a usage-only chunk (``choices: []``) when asked for, then ``data: [DONE]``.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Iterable
from typing import Any, NamedTuple

import orjson

from radix.openai.requests import CHAT

DONE_FRAME = b"data: [DONE]\n\n"
_CHOICES_TAIL = b"]}\n\n"


class TokenUsage(NamedTuple):
    """Token counts of one request; ``cached_tokens`` were found in the prefix cache."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


class ChoiceText(NamedTuple):
    """One whole choice: its index, text and finish reason."""

    index: int
    text: str
    finish_reason: str | None


def usage_object(usage: TokenUsage) -> dict[str, Any]:
    """OpenAI ``usage`` with ``prompt_tokens_details.cached_tokens``."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def sse_frame(obj: object) -> bytes:
    """One SSE event carrying ``obj`` as compact JSON."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class ResponseShape:
    """Renders one request's results for its endpoint (``completions`` or ``chat``)
    under ``model``, with ``response_id`` and ``created`` (new ones when not given: a
    resumed request keeps its first attempt's). Not shared between requests: it
    remembers which chat choices already sent their ``role``."""

    def __init__(self, endpoint: str, model: str, response_id: str | None = None,
                 created: int | None = None) -> None:
        self._chat = endpoint == CHAT
        self.endpoint = endpoint
        self.model = model
        self.id = response_id or f"{'chatcmpl' if self._chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time()) if created is None else created
        self._started: set[int] = set()

    def mark_started(self, index: int) -> None:
        """Choice ``index`` already sent its first chunk (in an earlier attempt): its
        next chat chunk carries no ``role``."""
        self._started.add(index)

    @functools.cached_property
    def _chunk_head(self) -> bytes:
        """A chunk frame up to its choices, the same for every chunk of the request: a
        chunk then costs one small JSON encoding of its choice, and its bytes are
        those of ``sse_frame(self._envelope(<chunk object>, [choice]))``."""
        return sse_frame(self._envelope(self._chunk_object, []))[: -len(_CHOICES_TAIL)]

    @property
    def _chunk_object(self) -> str:
        return "chat.completion.chunk" if self._chat else "text_completion"

    def _envelope(self, object_name: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": object_name, "created": self.created,
                "model": self.model, "choices": choices}

    def whole(self, choices: Iterable[ChoiceText], usage: TokenUsage) -> dict[str, Any]:
        """A whole (non-streamed) response."""
        rendered = []
        for choice in choices:
            body: dict[str, Any] = {"index": choice.index, "logprobs": None,
                                    "finish_reason": choice.finish_reason}
            if self._chat:
                body["message"] = {"role": "assistant", "content": choice.text}
            else:
                body["text"] = choice.text
            rendered.append(body)
        body = self._envelope("chat.completion" if self._chat else "text_completion", rendered)
        body["usage"] = usage_object(usage)
        return body

    def chunk(self, index: int, text: str, finish_reason: str | None) -> bytes:
        """One stream step of one choice as an SSE frame; empty when the step has
        neither text nor a finish reason (nothing to tell the client)."""
        if not text and finish_reason is None:
            return b""
        choice: dict[str, Any] = {"index": index}
        if self._chat:
            delta = {"content": text} if text else {}
            if index not in self._started:
                self._started.add(index)
                delta = {"role": "assistant", **delta}
            choice["delta"] = delta
        else:
            choice["text"] = text
        choice["logprobs"] = None
        choice["finish_reason"] = finish_reason
        return self._chunk_head + orjson.dumps(choice) + _CHOICES_TAIL

    def usage_chunk(self, usage: TokenUsage) -> bytes:
        """The final usage-only chunk (``stream_options.include_usage``)."""
        body = self._envelope(self._chunk_object, [])
        body["usage"] = usage_object(usage)
        return sse_frame(body)
