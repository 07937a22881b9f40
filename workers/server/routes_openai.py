"""``POST /v1/completions``, ``POST /v1/chat/completions`` (OpenAI shape) and
``GET /v1/models``.

Both run in scope ``anonymous`` with no public prefix. Streaming sends one SSE
chunk per choice per step that produced text (chat choices open with a
``{"role": "assistant"}`` delta), the finish reason on each choice's last chunk,
a usage chunk (``choices: []``) when ``stream_options.include_usage`` is set, then
``data: [DONE]``. A timeout mid-stream sends an error event before ``[DONE]``.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from aiohttp import web

from workers.engine.request import ChoiceDelta, RequestOutput, Usage
from workers.server.fields import Fields
from workers.server.openai_schema import OpenAIRequest, parse_chat, parse_completion
from workers.server.state import STATE, WorkerState, read_fields
from workers.server.streaming import ChoiceResult, collect, stream_response


def usage_dict(usage: Usage) -> dict[str, object]:
    """OpenAI usage with ``prompt_tokens_details.cached_tokens``."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


@dataclass(frozen=True)
class _Shape:
    """How completions and chat differ on the wire."""

    id_prefix: str
    object_name: str
    chunk_object_name: str
    is_chat: bool

    def choice(self, result: ChoiceResult) -> dict[str, object]:
        body: dict[str, object] = {"index": result.index, "logprobs": None,
                                   "finish_reason": result.finish_reason}  # fmt: skip
        if self.is_chat:
            body["message"] = {"role": "assistant", "content": result.text}
        else:
            body["text"] = result.text
        return body

    def chunk_choice(self, delta: ChoiceDelta) -> dict[str, object]:
        body: dict[str, object] = {"index": delta.index, "logprobs": None,
                                   "finish_reason": delta.finish_reason}  # fmt: skip
        if self.is_chat:
            body["delta"] = {"content": delta.text} if delta.text else {}
        else:
            body["text"] = delta.text
        return body


COMPLETION = _Shape("cmpl-", "text_completion", "text_completion", is_chat=False)
CHAT = _Shape("chatcmpl-", "chat.completion", "chat.completion.chunk", is_chat=True)


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models``: the one served model."""
    model = request.app[STATE].identity.model
    return web.json_response({"object": "list", "data": [
        {"id": model, "object": "model", "created": 0, "owned_by": "radix-router"}]})  # fmt: skip


async def completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/completions``."""
    state = request.app[STATE]
    fields = await read_fields(request)
    parsed = parse_completion(fields, state.worker.tokenizer, state.limits, state.identity.model)
    return await _respond(request, state, parsed, COMPLETION)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chat/completions``."""
    state = request.app[STATE]
    fields: Fields = await read_fields(request)
    parsed = parse_chat(fields, state.worker.tokenizer, state.limits, state.identity.model)
    return await _respond(request, state, parsed, CHAT)


async def _respond(
    request: web.Request, state: WorkerState, parsed: OpenAIRequest, shape: _Shape
) -> web.StreamResponse:
    head = {"id": shape.id_prefix + uuid.uuid4().hex, "created": int(time.time()),
            "model": parsed.model}  # fmt: skip
    timeout_s = state.config.request_timeout_s
    if not parsed.stream:
        choices, usage = await collect(state.engine, parsed.request, timeout_s)
        return web.json_response({**head, "object": shape.object_name,
                                  "choices": [shape.choice(c) for c in choices],
                                  "usage": usage_dict(usage)})  # fmt: skip
    chunk_head = {**head, "object": shape.chunk_object_name}
    preamble = []
    if shape.is_chat:
        preamble = [
            {**chunk_head, "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                        "logprobs": None, "finish_reason": None}]}
            for index in range(parsed.request.params.n)
        ]  # fmt: skip

    def render(output: RequestOutput) -> list[object]:
        chunks: list[object] = [
            {**chunk_head, "choices": [shape.chunk_choice(delta)]}
            for delta in output.deltas
            if delta.text or delta.finish_reason
        ]
        if output.usage is not None and parsed.include_usage:
            chunks.append({**chunk_head, "choices": [], "usage": usage_dict(output.usage)})
        return chunks

    return await stream_response(request, state.engine, parsed.request, timeout_s, render, preamble)
