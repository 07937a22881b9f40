"""``POST /generate``: token ids in and out, scope given by the (trusted) router.

Body: ``{"request_id"?, "token_ids" | "token_ids_b64", "scope"?, "num_public_tokens"?,
"max_cached_tokens"?, "sampling"?, "stream"?, "adapter"?}``: exactly one of ``token_ids`` (a JSON list) and
``token_ids_b64`` (base64 of 4 little-endian bytes per id, what routers send: a
third of the cost of decoding and checking a JSON list). ``scope`` defaults
to ``direct`` (``radix.tree.DIRECT``, as on the direct OpenAI routes), ``num_public_tokens`` to 0 (a multiple of the block size, at most
the prompt length); ``max_cached_tokens`` (an int >= 0, the scope's prefix-cache
quota, from the tenant's router config) is absent for no quota; ``adapter`` names a
registered LoRA adapter to run (absent or null: the base model; unknown: 404
``model_not_found``); ``sampling`` takes the
fields of ``radix.openai.sampling``. A missing ``request_id`` is generated.
``num_resumed_tokens`` (default 0; only with
``n`` 1) says the last that many prompt tokens are output an earlier attempt already
delivered (the router resuming a stream cut by a failed worker): they count as
completion tokens (``max_tokens``, stop strings, usage) and their text is not sent
again; text they held back (a partial UTF-8 character, a possible stop string) comes
with the next tokens, so the concatenated texts of both attempts equal one run's.
Streaming sends one event per choice per step (``token_ids`` may be non-empty
while ``text`` is empty: text is held back until it cannot be part of a stop
string or of an unfinished UTF-8 character), then a usage event, then ``[DONE]``.
With ``render`` (a ``radix.openai.rendered.RenderSpec``, stream only) the stream
carries the client's OpenAI answer itself, rendered here (what routers ask for).
"""

from __future__ import annotations

import dataclasses
import uuid

from aiohttp import web

from radix.openai.fields import Fields, token_id_list, token_ids_b64
from radix.openai.rendered import RenderedAnswer, rendered_answer
from radix.openai.responses import TokenUsage
from radix.openai.sampling import parse_sampling
from radix.tree import DIRECT
from workers.engine.request import GenerationRequest, RequestOutput, Usage
from workers.engine.stopping import StopChecker
from workers.server.errors import ApiError, bad_request
from workers.server.routes_lora import adapter_names
from workers.server.sampling import generation_request
from workers.server.state import STATE, WorkerState, read_fields
from workers.server.streaming import collect, stream_response

MAX_ID_LEN = 256


def _usage(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
    }


def _prompt_ids(fields: Fields, vocab_size: int) -> tuple[str, tuple[int, ...], bytes | None]:
    """The field that carried the prompt, its token ids, and its radix key when it came
    as one (``token_ids_b64``: the engine keeps those bytes instead of encoding the ids
    again); 400 unless exactly one of ``token_ids`` and ``token_ids_b64`` is given."""
    if fields.has("token_ids_b64"):
        if fields.has("token_ids"):
            raise bad_request("give exactly one of token_ids and token_ids_b64", "token_ids")
        key, token_ids = token_ids_b64(fields.raw("token_ids_b64"), "token_ids_b64", vocab_size)
        return "token_ids_b64", token_ids, key
    return "token_ids", token_id_list(fields.raw("token_ids"), "token_ids", vocab_size), None


async def generate(request: web.Request) -> web.StreamResponse:
    """``POST /generate``."""
    state = request.app[STATE]
    limits = state.limits
    fields = await read_fields(request)
    request_id = fields.string("request_id", None, MAX_ID_LEN) or uuid.uuid4().hex
    prompt_param, token_ids, prompt_key = _prompt_ids(fields, limits.vocab_size)
    scope = fields.string("scope", DIRECT, MAX_ID_LEN) or DIRECT
    num_public = fields.integer("num_public_tokens", 0, lo=0, hi=len(token_ids)) or 0
    if num_public % limits.block_size:
        raise bad_request(
            f"num_public_tokens must be a multiple of the block size {limits.block_size}",
            "num_public_tokens",
        )
    num_resumed = fields.integer("num_resumed_tokens", 0, lo=0, hi=len(token_ids) - 1) or 0
    max_cached_tokens = fields.integer("max_cached_tokens", None, lo=0)
    sampling = parse_sampling(fields.object("sampling"), limits.bounds)
    if num_resumed and sampling.n != 1:
        raise bad_request("num_resumed_tokens needs n = 1", "num_resumed_tokens")
    stream_mode = fields.boolean("stream", False)
    adapter = fields.string("adapter", None, MAX_ID_LEN)
    if adapter is not None and adapter not in adapter_names(state):
        raise ApiError(404, f"the LoRA adapter {adapter!r} is not registered on this worker",
                       param="adapter", code="model_not_found")  # fmt: skip
    engine_request = generation_request(
        token_ids, sampling, limits, prompt_param, scope=scope, num_public_tokens=num_public,
        num_resumed_tokens=num_resumed, max_cached_tokens=max_cached_tokens,
        prompt_key=prompt_key, adapter=adapter,
    )  # fmt: skip
    engine_request = dataclasses.replace(engine_request, request_id=request_id)
    timeout_s = state.config.request_timeout_s
    if fields.has("render"):
        if not stream_mode:
            raise bad_request("render needs stream = true", "render")
        answer = rendered_answer(fields.data, _resumed_text(state, engine_request))
        return await stream_response(request, state.engine, engine_request, timeout_s,
                                     lambda output: _rendered_events(answer, output))
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


def _rendered_events(answer: RenderedAnswer, output: RequestOutput) -> list[object]:
    events: list[object] = [answer.step(d.index, d.token_ids, d.text, d.finish_reason)
                            for d in output.deltas]
    if output.usage is not None:
        usage = output.usage
        events.append(answer.end(TokenUsage(usage.prompt_tokens, usage.completion_tokens,
                                            usage.cached_tokens)))
    return events


def _resumed_text(state: WorkerState, request: GenerationRequest) -> str:
    """The text the earlier attempts of a resumed request delivered (the engine replays
    the same tokens the same way, so it sends none of it again)."""
    num_resumed = request.num_resumed_tokens
    if not num_resumed:
        return ""
    tokenizer = state.worker.tokenizer
    num_prompt = len(request.prompt_token_ids) - num_resumed
    checker = StopChecker(tokenizer, request.params, tokenizer.eos_token_ids,
                          state.limits.max_model_len)
    return checker.replay(request.prompt_token_ids[num_prompt:], num_prompt)
