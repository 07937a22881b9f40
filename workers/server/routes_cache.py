"""``POST /reset_prefix_cache``: vLLM's route of that name, on our worker.

It evicts every cached block that no running sequence holds, in every namespace,
on the engine thread between two steps (``KVCacheManager.reset_prefix_cache``), and
announces each block it drops on the KV event stream (``removed``), so a router that
follows the events forgets them at once. A router that routes this worker without its
events (kind ``openai``) does not learn of it: its next predictions here are over what
the worker serves, which it counts (``router_cache_predictions_total{outcome="over"}``).
The route needs the worker's key, as every route but ``/health`` does (vLLM serves
it in its development mode only). Answer: 200 ``{"num_freed_blocks": N}``.
"""

from __future__ import annotations

from aiohttp import web

from workers.server.state import STATE


async def reset_prefix_cache(request: web.Request) -> web.Response:
    """Drop every unreferenced cached block; answer how many were freed."""
    engine = request.app[STATE].engine
    num_freed = await engine.call(lambda e: e.manager.reset_prefix_cache())
    return web.json_response({"num_freed_blocks": num_freed})


def add_routes(app: web.Application) -> None:
    """Register ``POST /reset_prefix_cache``."""
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
