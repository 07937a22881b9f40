"""The router's aiohttp application: every client route but the hot ones, and metrics.

``create_app`` wires the client routes around one ``Router``: the OpenAI routes (for
connections aiohttp holds: ``router.server.http1`` serves them itself and hands
aiohttp a connection at its first request for another route), ``/v1/models``,
``/health``, ``/openapi.json`` and the admin routes. ``create_metrics_app`` serves
``GET /metrics`` on its own address. ``router.server.serve`` runs them.
"""

from __future__ import annotations

import json
import logging
import socket

from aiohttp import web

from radix.api_errors import ApiError
from radix.http_api import load_document
from router.client import error_answer
from router.config import MAX_BODY_BYTES
from router.context import ROUTER, Router
from router.dispatch import ENDPOINTS, serve_openai
from router.server.admin import add_admin_routes
from router.server.aiohttp_client import AiohttpClient
from router.server.request_ids import add_request_id_header, request_id, request_id_middleware

_PR_SET_PDEATHSIG = 1
_GC_YOUNG_THRESHOLD = 20_000
log = logging.getLogger(__name__)


@web.middleware
async def error_middleware(request: web.Request, handler) -> web.StreamResponse:
    """Turn every refusal into an OpenAI-shaped error body; never a bare 500 page. An
    unexpected exception is logged under the request id, which the body quotes."""
    try:
        return await handler(request)
    except ApiError as exc:
        return web.json_response(exc.body(), status=exc.status, headers=exc.headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error = ApiError(exc.status, exc.reason)
        return web.json_response(error.body(), status=exc.status)
    except Exception as exc:
        error = error_answer(exc, request_id(request), f"{request.method} {request.path}")
        return web.json_response(error.body(), status=error.status)


def openai_handler(endpoint: str):
    """The aiohttp handler of an OpenAI route: the pipeline of ``router.dispatch``
    on an ``AiohttpClient``."""

    async def handler(request: web.Request) -> web.StreamResponse:
        client = AiohttpClient(request)
        await serve_openai(request.app[ROUTER], client, endpoint)
        assert client.response is not None
        return client.response

    return handler


async def health(request: web.Request) -> web.Response:
    """``GET /health``: 200 while the router runs, with its count of ready workers."""
    router = request.app[ROUTER]
    ready = sum(w.ready for w in router.registry.workers())
    return web.json_response({"status": "ok", "num_ready_workers": ready})


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models``: the served model names, then each LoRA adapter a worker
    registered, once, with the model it adapts as its ``parent`` (vLLM's shape; needs
    a valid key)."""
    router = request.app[ROUTER]
    router.auth.tenant(request.headers.get("Authorization"))
    listed = [{"id": name, "object": "model", "created": 0, "owned_by": "radix-router"}
              for name in router.models.names()]
    listed += [{"id": name, "object": "model", "created": 0, "owned_by": "radix-router",
                "parent": parent}
               for name, parent in sorted(router.registry.adapters().items())
               if name not in router.models]
    return web.json_response({"object": "list", "data": listed})


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics`` (metrics address only): Prometheus text."""
    router = request.app[ROUTER]
    body = router.metrics.render(router.registry.workers())
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})


def openapi_handler(server: str):
    """A handler answering ``GET /openapi.json`` with ``server``'s OpenAPI document
    (``radix.http_api``), read and encoded once, here."""
    body = json.dumps(load_document(server)).encode()

    async def openapi(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    return openapi


def create_app(router: Router) -> web.Application:
    """The router app. Its startup registers the configured workers; its cleanup
    closes the router. ``GET /openapi.json`` (no key needed) describes its routes."""
    app = web.Application(client_max_size=MAX_BODY_BYTES,
                          middlewares=[request_id_middleware, error_middleware])
    app[ROUTER] = router
    app.on_response_prepare.append(add_request_id_header)

    async def start_workers(app: web.Application) -> None:
        for worker in router.config.workers:
            router.registry.add(worker)
        await router.siblings.start(router.registry, router.models, router.index, router.canary)
        router.canary.start(router.registry.routable, router.session,
                            router.siblings.canary_changed)
        if router.discovery is not None:
            await router.discovery.start()

    async def close(app: web.Application) -> None:
        await router.close()

    app.on_startup.append(start_workers)
    app.on_cleanup.append(close)
    app.add_routes([
        *(web.post(path, openai_handler(endpoint)) for path, endpoint in ENDPOINTS.items()),
        web.get("/v1/models", models),
        web.get("/health", health),
        web.get("/openapi.json", openapi_handler("router")),
    ])
    add_admin_routes(app)
    return app


def create_metrics_app(router: Router) -> web.Application:
    """The metrics listener's app: ``GET /metrics`` of ``router`` and nothing else."""
    app = web.Application()
    app[ROUTER] = router
    app.add_routes([web.get("/metrics", metrics)])
    return app


def bind_socket(host: str, port: int, reuse_port: bool = False,
                setting: str = "listen") -> socket.socket:
    """A listening TCP socket (``port = 0`` picks a free one); RuntimeError naming the
    address and the config table ``setting`` when it cannot be bound (e.g. the port is
    taken)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        flag = "--port" if setting == "listen" else f"--{setting}-port"
        raise RuntimeError(f"{setting}: cannot listen on {host}:{port}: {exc.strerror} "
                           f"(set [{setting}] port in the config or pass {flag})") from exc
    sock.listen(1024)
    sock.setblocking(False)
    return sock
