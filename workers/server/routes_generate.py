"""``POST /generate``: token ids in and out, scope given by the (trusted) router.

The request and the plain answer are ``radix.generate``'s (one definition for the
router and the worker); a request that names a LoRA adapter this worker has not
registered is a 404 ``model_not_found``. With ``render`` the stream carries the
client's OpenAI answer itself, rendered here (what routers ask for). A request with a
session id and a retention hint has its prompt's cached blocks kept for its session
once it has run (``workers.kv_transfer.retention``).
"""

from __future__ import annotations

import uuid

from aiohttp import web

from radix.generate import GenerateRequest, step_event, usage_event, whole_answer
from radix.openai.rendered import RenderedAnswer
from radix.openai.responses import TokenUsage
from workers.engine.request import GenerationRequest, RequestOutput, Usage
from workers.engine.stopping import StopChecker
from workers.kv_transfer.producer import Producer
from workers.server.errors import ApiError
from workers.server.routes_lora import adapter_names
from workers.server.sampling import generation_request
from workers.server.state import STATE, ServerState, read_fields
from workers.server.streaming import collect, stream_response
from workers.server.transfer_legs import Leg, hold, leg_of


def _token_usage(usage: Usage) -> TokenUsage:
    return TokenUsage(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)


async def generate(request: web.Request) -> web.StreamResponse:
    """``POST /generate``."""
    state = request.app[STATE]
    limits = state.limits
    fields = await read_fields(request)
    call, token_ids = GenerateRequest.parse(fields, limits.bounds, limits.block_size)
    if call.adapter is not None and call.adapter not in adapter_names(state):
        raise ApiError(404, f"the LoRA adapter {call.adapter!r} is not registered on this "
                            f"worker", param="adapter", code="model_not_found")
    request_id = call.request_id or uuid.uuid4().hex
    leg = Leg(call.kv_transfer_params, call.prompt_key, call.scope, call.num_public_tokens,
              call.adapter, call.stream)
    try:
        async with leg_of(state.transfer, leg) as producer:
            return await _run(request, state, call, token_ids, request_id,
                              fields.has("token_ids_b64"), producer and (producer, leg))
    finally:
        _retain(state, call)


def _retain(state: ServerState, call: GenerateRequest) -> None:
    """Keep the prompt's cached blocks for ``call``'s session when it asked for it (a
    session id and a retention hint; base model only), however the request ended (its
    client may close the stream the moment the answer is complete)."""
    if (call.session_id is None or call.retention_s is None or call.adapter is not None
            or state.transfer is None):
        return
    state.transfer.retainer.retain_later(call.prompt_key, call.scope, call.session_id,
                                         call.retention_s, call.max_cached_tokens)


async def _run(request: web.Request, state: ServerState, call: GenerateRequest,
               token_ids: tuple[int, ...], request_id: str, as_b64: bool,
               prefill_leg: tuple[Producer, Leg] | None) -> web.StreamResponse:
    limits = state.limits
    engine_request = generation_request(
        token_ids, call.sampling, limits,
        "token_ids_b64" if as_b64 else "token_ids", scope=call.scope,
        num_public_tokens=call.num_public_tokens, num_resumed_tokens=call.num_resumed_tokens,
        max_cached_tokens=call.max_cached_tokens, prompt_key=call.prompt_key,
        adapter=call.adapter, request_id=request_id, priority=call.priority,
    )
    timeout_s = state.config.request_timeout_s
    if call.render is not None:
        answer = RenderedAnswer(call.render, _resumed_text(state, engine_request))
        return await stream_response(request, state.engine, engine_request, timeout_s,
                                     lambda output: _rendered_events(answer, output))
    if not call.stream:
        choices, usage = await collect(state.engine, engine_request, timeout_s)
        answer = whole_answer(request_id, choices, _token_usage(usage))
        if prefill_leg is not None:
            answer["kv_transfer_params"] = await hold(*prefill_leg)
        return web.json_response(answer)

    def render(output: RequestOutput) -> list[object]:
        events: list[object] = [step_event(request_id, delta) for delta in output.deltas]
        if output.usage is not None:
            events.append(usage_event(request_id, _token_usage(output.usage)))
        return events

    return await stream_response(request, state.engine, engine_request, timeout_s, render)


def _rendered_events(answer: RenderedAnswer, output: RequestOutput) -> list[object]:
    events: list[object] = [answer.step(d.index, d.token_ids, d.text, d.finish_reason)
                            for d in output.deltas]
    if output.usage is not None:
        events.append(answer.end(_token_usage(output.usage)))
    return events


def _resumed_text(state: ServerState, request: GenerationRequest) -> str:
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
