"""The aiohttp application: routes and the two middlewares.

Middlewares, outermost first:

1. errors: ``ApiError`` and aiohttp's HTTP errors (unknown route 404, wrong method
   405, body too large 413) become OpenAI-shaped JSON bodies. Any other exception
   is a bug: it is logged with its traceback, counted in
   ``http_unhandled_exceptions_total`` and answered 500 with an error body.
2. auth: with a worker API key (``workers.server.access``), every route but
   ``/health`` and ``/openapi.json`` needs ``Authorization: Bearer <key>`` (compared
   in constant time); else 401. ``/generate`` and ``/kv/events`` are the router's (it
   holds the key); the OpenAI routes serve any holder of the key under one scope
   (trusted callers).
"""

from __future__ import annotations

import hmac
import logging

from aiohttp import web
from aiohttp.typedefs import Handler

from workers.server import (
    routes_cache,
    routes_generate,
    routes_kv,
    routes_lora,
    routes_openai,
    routes_peers,
    routes_status,
    transfer_legs,
)
from workers.server.errors import ApiError, error_body, error_response
from workers.server.state import STATE, ServerState

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 32 * 2**20
PUBLIC_PATHS = frozenset({"/health", "/openapi.json"})


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Map every failure to an OpenAI-shaped error response (see the module docstring)."""
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return web.json_response(error_body(exc.status, exc.reason), status=exc.status)
    except Exception:
        log.exception("unhandled exception in %s %s", request.method, request.path)
        request.app[STATE].unhandled_errors.inc()
        return web.json_response(error_body(500, "internal server error"), status=500)


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Require the worker key on every route but ``PUBLIC_PATHS`` (when one is configured)."""
    key = request.app[STATE].api_key
    if key is not None and request.path not in PUBLIC_PATHS:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            raise ApiError(401, "missing or invalid worker API key", code="invalid_api_key")
    return await handler(request)


def create_app(state: ServerState) -> web.Application:
    """The worker's application over ``state``."""
    app = web.Application(
        middlewares=[error_middleware, auth_middleware], client_max_size=MAX_BODY_BYTES
    )
    app[STATE] = state
    app.router.add_get("/v1/models", routes_openai.models)
    app.router.add_post("/v1/completions", routes_openai.completions)
    app.router.add_post("/v1/chat/completions", routes_openai.chat_completions)
    app.router.add_post("/generate", routes_generate.generate)
    app.router.add_get("/health", routes_status.health)
    app.router.add_get("/ready", routes_status.ready)
    app.router.add_get("/info", routes_status.info)
    app.router.add_get("/metrics", routes_status.metrics)
    app.router.add_get("/kv/events", routes_kv.kv_events)
    app.router.add_get("/openapi.json", routes_status.openapi)
    routes_peers.add_routes(app)
    routes_lora.add_routes(app)
    routes_cache.add_routes(app)
    transfer_legs.add_routes(app)
    return app
