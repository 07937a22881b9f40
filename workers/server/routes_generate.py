"""``POST /generate``: token ids in and out, scope given by the (trusted) router.

Body: ``{"request_id"?, "token_ids", "scope"?, "num_public_tokens"?, "sampling"?,
"stream"?}``; ``scope`` defaults to ``anonymous``, ``num_public_tokens`` to 0 (a
multiple of the block size, at most the prompt length); ``sampling`` takes the
fields of ``workers.server.sampling``. A missing ``request_id`` is generated.
Streaming sends one event per choice per step (``token_ids`` may be non-empty
while ``text`` is empty: text is held back until it cannot be part of a stop
string or of an unfinished UTF-8 character), then a usage event, then ``[DONE]``.
"""

from __future__ import annotations

import uuid

from aiohttp import web

from workers.engine.request import RequestOutput, Usage
from workers.server.errors import bad_request
from workers.server.fields import token_id_list
from workers.server.sampling import generation_request, parse_sampling
from workers.server.state import STATE, read_fields
from workers.server.streaming import collect, stream_response

MAX_ID_LEN = 256


def _usage(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
    }


async def generate(request: web.Request) -> web.StreamResponse:
    """``POST /generate``."""
    state = request.app[STATE]
    limits = state.limits
    fields = await read_fields(request)
    request_id = fields.string("request_id", None, MAX_ID_LEN) or uuid.uuid4().hex
    token_ids = token_id_list(fields.raw("token_ids"), "token_ids", limits.vocab_size)
    scope = fields.string("scope", "anonymous", MAX_ID_LEN) or "anonymous"
    num_public = fields.integer("num_public_tokens", 0, lo=0, hi=len(token_ids)) or 0
    if num_public % limits.block_size:
        raise bad_request(
            f"num_public_tokens must be a multiple of the block size {limits.block_size}",
            "num_public_tokens",
        )
    sampling = parse_sampling(fields.object("sampling"), limits)
    stream_mode = fields.boolean("stream", False)
    engine_request = generation_request(
        token_ids, sampling, limits, "token_ids", scope=scope, num_public_tokens=num_public
    )
    timeout_s = state.config.request_timeout_s
    if not stream_mode:
        choices, usage = await collect(state.engine, engine_request, timeout_s)
        return web.json_response({
            "request_id": request_id,
            "choices": [{"index": c.index, "token_ids": c.token_ids, "text": c.text,
                         "finish_reason": c.finish_reason} for c in choices],
            "usage": _usage(usage),
        })  # fmt: skip

    def render(output: RequestOutput) -> list[object]:
        events: list[object] = [
            {"request_id": request_id, "index": delta.index, "token_ids": list(delta.token_ids),
             "text": delta.text, "finish_reason": delta.finish_reason}
            for delta in output.deltas
        ]  # fmt: skip
        if output.usage is not None:
            events.append({"request_id": request_id, "usage": _usage(output.usage)})
        return events

    return await stream_response(request, state.engine, engine_request, timeout_s, render)
