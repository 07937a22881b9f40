"""``GET /health``, ``/ready``, ``/info``, ``/metrics`` and ``/openapi.json``.

``/ready`` and ``/info`` read the engine's latest published ``EngineStats`` (a
snapshot swapped in by the engine thread after every step), never the engine.
"""

from __future__ import annotations

import functools
import json

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from radix.http_api import load_document
from workers.server.state import STATE, ServerState


async def health(request: web.Request) -> web.Response:
    """200 while the process and its engine thread are alive, else 503 (no key needed)."""
    if request.app[STATE].engine.failed:
        return web.json_response({"status": "engine stopped"}, status=503)
    return web.json_response({"status": "ok"})


def _ready_body(state: ServerState) -> dict[str, object]:
    stats = state.engine.stats
    return {
        "ready": state.is_ready(),
        **state.identity.to_dict(),
        "num_free_blocks": stats.kv_blocks_free,
        "draining": not state.engine.admitting,
        **state.worker.lora.describe(),
    }


async def ready(request: web.Request) -> web.Response:
    """200 while ``ServerState.is_ready``: once the start-up self-test passed, and again after a
    failed batched step once it passes anew; 503 otherwise, for good once the engine
    thread has died or the worker started draining (SIGTERM). Same body either way,
    with ``draining`` true while draining."""
    state = request.app[STATE]
    return web.json_response(_ready_body(state), status=200 if state.is_ready() else 503)


def _transfer_endpoint(state: ServerState) -> dict[str, object] | None:
    """Where this worker's producer serves its blocks (``host`` and ``port`` null: it
    is not a ``kv_producer``; a router checks prefill legs' params against them),
    whether it pulls (``consumer``) and its KV costs; None without a transfer role."""
    return None if state.transfer is None else state.transfer.info()


async def info(request: web.Request) -> web.Response:
    """Identity, KV plan, KV block counts, live load (routers poll this) and the
    transfer roles (``kv_transfer``: the producer's endpoint, whether it consumes, its
    KV costs; null without a role)."""
    state = request.app[STATE]
    stats = state.engine.stats
    engine_config = state.worker.engine_config
    return web.json_response({
        **_ready_body(state),
        "kv_transfer": _transfer_endpoint(state),
        "kv_plan": state.identity.kv_plan_dict(),
        "prefix_cache": state.worker.prefix_cache,
        "kv": {
            "num_total_blocks": stats.kv_blocks_total,
            "num_free_blocks": stats.kv_blocks_free,
            "num_cached_blocks": stats.kv_blocks_cached,
            "num_used_blocks": stats.kv_blocks_total - stats.kv_blocks_free - stats.kv_blocks_cached,
        },
        "engine": {
            "max_batched_tokens": engine_config.max_batched_tokens,
            "max_num_seqs": engine_config.max_num_seqs,
            "max_waiting_requests": engine_config.max_waiting_requests,
        },
        "load": {**stats.load(), **state.held_blocks()},
    })


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text of this process's registry."""
    body = generate_latest(request.app[STATE].worker.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


@functools.cache
def _openapi_body() -> bytes:
    return json.dumps(load_document("worker")).encode()


async def openapi(request: web.Request) -> web.Response:
    """The worker's OpenAPI document (``radix.http_api``; no key needed: it holds
    nothing a deployment configures)."""
    return web.Response(body=_openapi_body(), content_type="application/json")
