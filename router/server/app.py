"""The router's aiohttp application and the loop that serves it.

``create_app`` wires the client routes around one ``Router``; ``create_metrics_app``
serves ``GET /metrics`` on its own address (``[metrics]``, loopback by default: it
names tenants and workers). ``serve`` binds both, prints ``METRICS http://HOST:PORT``
and then ``READY http://HOST:PORT`` once requests are accepted. SIGINT/SIGTERM
drain it: the listening sockets close at once, requests in flight (streams included)
get ``listen.drain_timeout_s`` to finish, then the router closes and exits. Handlers
run with ``handler_cancellation``: a client that disconnects cancels its handler,
which closes the upstream response and so cancels the request on the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import json
import logging
import os
import signal
import socket

from aiohttp import web

from radix.api_errors import ApiError
from radix.http_api import load_document
from router.config import RouterConfig
from router.server.admin import add_admin_routes
from router.server.client import AiohttpClient, error_answer
from router.server.context import ROUTER, Router
from router.server.dispatch import ENDPOINTS, serve_openai
from router.server.request_ids import add_request_id_header, request_id, request_id_middleware
from router.server.slow_clients import runner_options
from router.state.redis_state import shared_backends

MAX_BODY_BYTES = 32 * 2**20
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
    """The aiohttp handler of an OpenAI route: the pipeline of ``router.server.dispatch``
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
    """``GET /v1/models``: the served model names (needs a valid key)."""
    router = request.app[ROUTER]
    router.auth.tenant(request.headers.get("Authorization"))
    return web.json_response({"object": "list", "data": [
        {"id": name, "object": "model", "created": 0, "owned_by": "radix-router"}
        for name in router.models.names()
    ]})


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics`` (metrics address only): Prometheus text."""
    router = request.app[ROUTER]
    body = router.metrics.render(router.registry.workers(), router.index.stats().num_nodes)
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
        await router.peers.start(router.registry, router.models, router.index)

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


async def serve(config: RouterConfig, secret: bytes, sock: socket.socket,
                metrics_sock: socket.socket, announce: bool = True) -> None:
    """Serve clients on ``sock`` and ``/metrics`` on ``metrics_sock`` until SIGINT or
    SIGTERM, then close everything. With ``announce``, print ``METRICS <url>`` and
    ``READY <url>`` once serving."""
    for i, worker in enumerate(config.workers):
        if worker.url is None:
            raise ValueError(f"workers[{i}].url: required when the router runs on its own "
                             "(launch is for `radix-router up`)")
    if config.redis.launch and config.redis.url is None:
        raise ValueError("redis.url: required when the router runs on its own "
                         "(launch is for `radix-router up`)")
    router = Router.build(config, secret, *shared_backends(config))
    runner = web.AppRunner(create_app(router), handler_cancellation=True, access_log=None,
                           shutdown_timeout=config.listen.drain_timeout_s,
                           **runner_options(config.listen))
    metrics_runner = web.AppRunner(create_metrics_app(router), access_log=None)
    await runner.setup()
    await metrics_runner.setup()
    tune_gc()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await web.SockSite(metrics_runner, metrics_sock).start()
        await web.SockSite(runner, sock).start()
        metrics_url = _url(metrics_sock)
        log.info("metrics at %s/metrics", metrics_url)
        if announce:
            print(f"METRICS {metrics_url}", flush=True)
            print(f"READY {_url(sock)}", flush=True)
        await stop.wait()
    finally:
        await runner.cleanup()
        await metrics_runner.cleanup()


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def metrics_socket(config: RouterConfig, process_index: int) -> socket.socket:
    """The metrics listener of router process ``process_index`` (0 for the first):
    ``metrics.port + process_index``, or a free port when ``metrics.port`` is 0."""
    port = config.metrics.port + process_index if config.metrics.port else 0
    return bind_socket(config.metrics.host, port, setting="metrics")


def tune_gc() -> None:
    """Freeze what start-up built (modules, tokenizer, app: never garbage) out of the
    collector's reach, and collect the young generation every 20,000 allocations
    instead of 700: every young collection walks each in-flight request's token id
    list (thousands of references), so at 700 it cost about 50 us per request."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(_GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])


def serve_processes(config: RouterConfig, secret: bytes, num_processes: int) -> None:
    """Run ``num_processes`` router processes on one port. Each binds its own
    SO_REUSEPORT socket (the kernel spreads connections over them) and is a whole
    router: its own index, following every worker's KV events, its own registry and,
    with Redis, its own router id and lease (limits exact across all of them; without
    Redis the caller gives each a share, ``router.cli.limits_for_processes``). The
    parent serves too, announces READY, and on exit stops the children it forked."""
    if num_processes == 1:
        asyncio.run(serve(config, secret, bind_socket(config.listen.host, config.listen.port),
                          metrics_socket(config, 0)))
        return
    sock = bind_socket(config.listen.host, config.listen.port, reuse_port=True)
    port = sock.getsockname()[1]
    children = []
    for index in range(1, num_processes):
        pid = os.fork()
        if pid == 0:
            sock.close()
            die_with_parent()
            child_sock = bind_socket(config.listen.host, port, reuse_port=True)
            asyncio.run(serve(config, secret, child_sock, metrics_socket(config, index),
                              announce=False))
            os._exit(0)
        children.append(pid)
    try:
        asyncio.run(serve(config, secret, sock, metrics_socket(config, 0)))
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in children:
            os.waitpid(pid, 0)


def die_with_parent() -> None:
    """SIGTERM the calling process when its parent dies (Linux prctl); used in forked
    router processes and, before exec, in the children of `radix-router up`."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
