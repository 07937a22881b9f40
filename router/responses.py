"""Worker ``/generate`` results rendered as OpenAI completions and chat objects.

The worker already returns text (whole or as deltas), so rendering is reshaping:
ids, ``object`` names, ``choices`` and ``usage`` with
``prompt_tokens_details.cached_tokens``. Stream chunks are SSE ``data:`` frames.
"""

from __future__ import annotations

import functools
import json
import time
import uuid
from typing import Any

from router.requests import CHAT

DONE_FRAME = b"data: [DONE]\n\n"
_CHOICES_TAIL = b"]}\n\n"
_compact_json = json.JSONEncoder(separators=(",", ":")).encode


def openai_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """``/generate`` usage -> OpenAI usage."""
    prompt = int(usage.get("prompt_tokens", 0))
    completion = int(usage.get("completion_tokens", 0))
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": int(usage.get("cached_tokens", 0))},
    }


def sse_frame(obj: dict[str, Any]) -> bytes:
    """One SSE event carrying ``obj`` as compact JSON."""
    return b"data: " + _compact_json(obj).encode() + b"\n\n"


class ResponseShape:
    """Renders one request's results for its endpoint (``completions`` or ``chat``)
    under the router's model name. Not shared between requests: it remembers which
    chat choices already sent their ``role``."""

    def __init__(self, endpoint: str, model: str) -> None:
        self._chat = endpoint == CHAT
        self._model = model
        self.id = f"{'chatcmpl' if self._chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self._started: set[int] = set()

    @functools.cached_property
    def _chunk_head(self) -> bytes:
        """A chunk frame up to its choices, the same for every chunk of the request: a
        chunk then costs one small JSON encoding of its choice, and its bytes are
        those of ``sse_frame(self._envelope(<chunk object>, [choice]))``."""
        chunk_object = "chat.completion.chunk" if self._chat else "text_completion"
        return sse_frame(self._envelope(chunk_object, []))[: -len(_CHOICES_TAIL)]

    def _envelope(self, object_name: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": object_name, "created": self.created,
                "model": self._model, "choices": choices}

    def full(self, result: dict[str, Any]) -> dict[str, Any]:
        """A non-streaming ``/generate`` response as a whole OpenAI response."""
        choices = []
        for choice in result.get("choices", []):
            index, text = choice.get("index", 0), choice.get("text", "")
            reason = choice.get("finish_reason")
            if self._chat:
                choices.append({"index": index, "finish_reason": reason, "logprobs": None,
                                "message": {"role": "assistant", "content": text}})
            else:
                choices.append({"index": index, "text": text, "logprobs": None,
                                "finish_reason": reason})
        body = self._envelope("chat.completion" if self._chat else "text_completion", choices)
        body["usage"] = openai_usage(result.get("usage", {}))
        return body

    def chunk(self, event: dict[str, Any]) -> bytes:
        """One ``/generate`` stream step as one OpenAI stream chunk frame."""
        index = event.get("index", 0)
        text = event.get("text", "")
        reason = event.get("finish_reason")
        if self._chat:
            delta: dict[str, Any] = {"content": text}
            if index not in self._started:
                self._started.add(index)
                delta["role"] = "assistant"
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": index, "text": text, "logprobs": None, "finish_reason": reason}
        return self._chunk_head + _compact_json(choice).encode() + _CHOICES_TAIL

    def usage_chunk(self, usage: dict[str, Any]) -> bytes:
        """The final usage-only chunk (``stream_options.include_usage``)."""
        body = self._envelope("chat.completion.chunk" if self._chat else "text_completion", [])
        body["usage"] = openai_usage(usage)
        return sse_frame(body)
