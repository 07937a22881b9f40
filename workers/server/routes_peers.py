"""What sglang-router and vllm-router ask of a worker, so ours can stand behind them.

Probes (docs/worker.md lists who calls which):

- ``GET /server_info``, ``/get_server_info``, ``/model_info``, ``/get_model_info``
  (sglang-router, at registration): which model this worker serves and its limits.
- ``POST /tokenize`` (vLLM's shape: ``{"count", "max_model_len", "tokens"}``) and
  ``POST /v1/completions/render`` / ``POST /v1/chat/completions/render`` (vllm-router,
  per request, to route on token ids): the prompt's token ids exactly as
  ``/v1/completions`` and ``/v1/chat/completions`` would prefill them, through the
  same parser and the same tokenizer, so the peers' trees see our tokens.

The peers also add fields of their own engines to every forwarded request
(``PEER_NEUTRAL_FIELDS``); ``strip_peer_fields`` drops them when they hold the value
that changes nothing here, and leaves any other value for the parser to refuse.
Every route here needs the worker key like the other routes (the peers send it with
their ``--api-key``); ``/health`` stays open.
"""

from __future__ import annotations

import itertools
from typing import Any

from aiohttp import web

from radix.openai.json_body import decode_json_object
from radix.openai.prompt import prompt_token_ids
from radix.openai.requests import CHAT, COMPLETIONS
from workers.server import openai_schema
from workers.server.state import STATE, ServerState

PEER_NEUTRAL_FIELDS: dict[str, object] = {
    "no_stop_trim": False, "skip_special_tokens": True,
    "return_hidden_states": False, "separate_reasoning": True, "stream_reasoning": True,
    "continue_final_message": False, "include_reasoning": True, "add_special_tokens": True,
    "add_generation_prompt": True,
}
_render_ids = itertools.count(1)


def strip_peer_fields(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without the peer fields that hold their neutral value."""
    return {name: value for name, value in body.items()
            if not (name in PEER_NEUTRAL_FIELDS and value == PEER_NEUTRAL_FIELDS[name])}


def _model_limits(state: ServerState) -> dict[str, object]:
    identity = state.identity
    engine = state.worker.engine_config
    return {
        "model_path": identity.model_source,
        "served_model_name": identity.model,
        "tokenizer_path": identity.model_source,
        "is_generation": True,
        "max_model_len": identity.max_model_len,
        "context_length": identity.max_model_len,
        "max_running_requests": engine.max_num_seqs,
        "max_total_num_tokens": identity.kv_plan.num_blocks * identity.namespace.block_size,
    }


async def server_info(request: web.Request) -> web.Response:
    """``GET /server_info`` (``/get_server_info``): the served model and its limits."""
    return web.json_response(_model_limits(request.app[STATE]))


async def model_info(request: web.Request) -> web.Response:
    """``GET /model_info`` (``/get_model_info``): the served model."""
    limits = _model_limits(request.app[STATE])
    return web.json_response({name: limits[name] for name in
                              ("model_path", "tokenizer_path", "is_generation", "served_model_name")})


async def _prompt_ids(request: web.Request, endpoint: str | None) -> tuple[str, list[int]]:
    """The model and prompt token ids of the body (``endpoint`` None: chat when it has
    ``messages``); the errors of ``/v1/completions`` for a bad body."""
    state = request.app[STATE]
    raw = decode_json_object(await request.read())
    endpoint = endpoint or (CHAT if "messages" in raw else COMPLETIONS)
    body = strip_peer_fields(raw)
    parsed = openai_schema.parse(body, endpoint, state.limits, state.identity.served_model_names,
                                 state.worker.tokenizer)
    return parsed.model or state.identity.model, prompt_token_ids(parsed, state.worker.tokenizer)


async def tokenize(request: web.Request) -> web.Response:
    """``POST /tokenize``: ``{"prompt"}`` or ``{"messages"}`` (chat template applied)."""
    _, token_ids = await _prompt_ids(request, None)
    state = request.app[STATE]
    return web.json_response({"count": len(token_ids), "max_model_len": state.identity.max_model_len,
                              "tokens": token_ids, "token_strs": None})


def _rendered(model: str, token_ids: list[int], prefix: str) -> dict[str, object]:
    return {"request_id": f"{prefix}-render-{next(_render_ids)}", "model": model,
            "token_ids": token_ids}


async def render_completion(request: web.Request) -> web.Response:
    """``POST /v1/completions/render``: a list of one rendered prompt (vLLM's shape)."""
    model, token_ids = await _prompt_ids(request, COMPLETIONS)
    return web.json_response([_rendered(model, token_ids, "cmpl")])


async def render_chat(request: web.Request) -> web.Response:
    """``POST /v1/chat/completions/render``: the rendered chat prompt."""
    model, token_ids = await _prompt_ids(request, CHAT)
    return web.json_response(_rendered(model, token_ids, "chatcmpl"))


def add_routes(app: web.Application) -> None:
    """Register the peer routes on ``app``."""
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, server_info)
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, model_info)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/v1/completions/render", render_completion)
    app.router.add_post("/v1/chat/completions/render", render_chat)
