"""``POST /v1/completions``, ``POST /v1/chat/completions`` (OpenAI shape, rendered by
``radix.openai.responses``, the same shapes the router renders) and
``GET /v1/models``.

Requests run in scope ``direct``, or in their ``cache_salt``'s scope (see
``openai_schema``), with no public prefix. Fields the peer routers add at their
neutral values are dropped first (``routes_peers``). Long prompt texts are tokenized on a
thread, off the event loop. Streams end with a usage chunk when
``stream_options.include_usage`` is set, then ``data: [DONE]``; a timeout
mid-stream sends an error event before ``[DONE]``. ``kv_transfer_params`` makes a
request one leg of a disaggregated pair, as on vLLM (``transfer_legs``, docs/pd.md).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from radix.keys import to_key
from radix.kv_transfer import wants_remote_decode
from radix.openai.json_body import decode_json_object
from radix.openai.prompt import prompt_token_ids
from radix.openai.requests import CHAT, COMPLETIONS, INLINE_TOKENIZE_CHARS, OpenAIRequest
from radix.openai.responses import ChoiceText, ResponseShape, TokenUsage
from workers.engine.request import GenerationRequest, RequestOutput, Usage
from workers.kv_transfer.producer import Producer
from workers.server import openai_schema, routes_lora, routes_peers
from workers.server.errors import bad_request
from workers.server.state import STATE
from workers.server.streaming import collect, stream_response
from workers.server.transfer_legs import Leg, hold, leg_of


def token_usage(usage: Usage) -> TokenUsage:
    """The engine's usage in the shared shape."""
    return TokenUsage(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models``: each served name of the model, then each LoRA adapter
    (vLLM's shape: ``root`` is the model or adapter as loaded, ``parent`` the base
    model's first served name for an adapter and null for the base,
    ``max_model_len`` the longest prompt + output accepted)."""
    state = request.app[STATE]
    identity = state.identity
    cards = [(name, identity.model_source, None) for name in identity.served_model_names]
    cards += [(a.name, a.path, identity.model) for a in state.worker.lora.slots.published]
    return web.json_response({"object": "list", "data": [
        {"id": name, "object": "model", "created": 0, "owned_by": "radix-router",
         "root": root, "parent": parent, "max_model_len": identity.max_model_len}
        for name, root, parent in cards]})


async def completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/completions``."""
    return await _serve(request, COMPLETIONS)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chat/completions``."""
    return await _serve(request, CHAT)


async def _token_ids(parsed: OpenAIRequest, request: web.Request) -> tuple[int, ...]:
    tokenizer = request.app[STATE].worker.tokenizer
    if parsed.num_text_chars() <= INLINE_TOKENIZE_CHARS:
        return tuple(prompt_token_ids(parsed, tokenizer))
    token_ids = await asyncio.get_running_loop().run_in_executor(
        None, prompt_token_ids, parsed, tokenizer)
    return tuple(token_ids)


async def _serve(request: web.Request, endpoint: str) -> web.StreamResponse:
    state = request.app[STATE]
    body = routes_peers.strip_peer_fields(decode_json_object(await request.read()))
    params = body.pop("kv_transfer_params", None)
    if params is not None and not isinstance(params, dict):
        raise bad_request("kv_transfer_params must be an object", "kv_transfer_params")
    if wants_remote_decode(params):  # vllm-router adds it; the one token is discarded
        body.pop("min_tokens", None)
    tokenizer = state.worker.tokenizer
    served = state.identity.served_model_names
    parsed = openai_schema.parse(body, endpoint, state.limits, served, tokenizer,
                                 routes_lora.adapter_names(state))
    engine_request = openai_schema.engine_request(parsed, await _token_ids(parsed, request),
                                                  state.limits, served)
    leg = Leg(params, to_key(engine_request.prompt_token_ids), engine_request.scope, 0,
              engine_request.adapter, parsed.stream)
    async with leg_of(state.transfer, leg) as producer:
        return await _answer(request, endpoint, parsed, engine_request,
                             producer and (producer, leg))


async def _answer(request: web.Request, endpoint: str, parsed: OpenAIRequest,
                  engine_request: GenerationRequest,
                  prefill_leg: tuple[Producer, Leg] | None) -> web.StreamResponse:
    state = request.app[STATE]
    shape = ResponseShape(endpoint, parsed.model or state.identity.model)
    timeout_s = state.config.request_timeout_s
    if not parsed.stream:
        choices, usage = await collect(state.engine, engine_request, timeout_s)
        answer = shape.whole([ChoiceText(c.index, c.text, c.finish_reason) for c in choices],
                             token_usage(usage))
        if prefill_leg is not None:
            answer["kv_transfer_params"] = await hold(*prefill_leg)
        return web.json_response(answer)

    def render(output: RequestOutput) -> list[bytes]:
        frames = [shape.chunk(d.index, d.text, d.finish_reason) for d in output.deltas]
        if output.usage is not None and parsed.include_usage:
            frames.append(shape.usage_chunk(token_usage(output.usage)))
        return [frame for frame in frames if frame]

    return await stream_response(request, state.engine, engine_request, timeout_s, render)
