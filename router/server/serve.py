"""Running the router: its listeners, its process(es), and how they stop.

``Listener`` serves the client routes on one socket: the lean HTTP/1.1 server
(``router.server.http1``) takes each connection and runs the OpenAI routes itself;
a connection that asks for anything else is handed to the aiohttp app
(``router.server.app``), on the same event loop. ``serve`` runs one router process on
uvloop: the listener, ``GET /metrics`` on its own address (``[metrics]``, loopback by
default: it names tenants and workers), printing ``METRICS http://HOST:PORT`` and then
``READY http://HOST:PORT`` once requests are accepted. SIGINT/SIGTERM drain it: the
listening sockets close at once, requests in flight (streams included) get
``listen.drain_timeout_s`` to finish, then the router closes and exits. A client that
disconnects cancels its request, which closes the upstream response and so cancels
the request on the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import logging
import os
import signal
import socket

import uvloop
from aiohttp import web

from router.config import MAX_BODY_BYTES, RouterConfig
from router.context import Router, shared_backends
from router.dispatch import ENDPOINTS, serve_openai
from router.server.app import bind_socket, create_app, create_metrics_app
from router.server.http1 import Http1Connection, Http1Settings
from router.server.slow_clients import runner_options

_PR_SET_PDEATHSIG = 1
_GC_YOUNG_THRESHOLD = 20_000
_DRAIN_POLL_S = 0.05
log = logging.getLogger(__name__)


class Listener:
    """The client routes of ``router`` on one listening socket (see the module
    docstring). ``start`` runs the app's startup (workers registered); ``close``
    drains and then runs its cleanup (the router closed)."""

    def __init__(self, router: Router, runner: web.AppRunner, server: asyncio.Server,
                 settings: Http1Settings) -> None:
        self._router = router
        self._runner = runner
        self._server = server
        self._settings = settings

    @classmethod
    async def start(cls, router: Router, sock: socket.socket) -> Listener:
        """Serve ``router`` on ``sock`` (bound and listening) from now on."""
        listen = router.config.listen
        runner = web.AppRunner(create_app(router), handler_cancellation=True, access_log=None,
                               shutdown_timeout=listen.drain_timeout_s,
                               **runner_options(listen))
        await runner.setup()
        assert runner.server is not None
        settings = Http1Settings(
            serve=lambda client, endpoint: serve_openai(router, client, endpoint),
            endpoints={path.encode(): endpoint for path, endpoint in ENDPOINTS.items()},
            handoff=runner.server, count_refusal=router.metrics.count_refusal,
            max_body_bytes=MAX_BODY_BYTES,
            keepalive_timeout_s=listen.keepalive_timeout_s)
        server = await asyncio.get_running_loop().create_server(
            lambda: Http1Connection(settings), sock=sock)
        return cls(router, runner, server, settings)

    async def close(self) -> None:
        """Stop accepting, give requests in flight ``listen.drain_timeout_s`` to end,
        drop what is left, then close aiohttp's connections and the router."""
        self._server.close()
        connections = self._settings.connections
        for connection in list(connections):
            connection.shut_down()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._router.config.listen.drain_timeout_s
        while any(not c.handed_off for c in connections) and loop.time() < deadline:
            await asyncio.sleep(_DRAIN_POLL_S)
        for connection in list(connections):
            if not connection.handed_off:
                connection.abort()
        await self._runner.cleanup()


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
    metrics_runner = web.AppRunner(create_metrics_app(router), access_log=None)
    await metrics_runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await web.SockSite(metrics_runner, metrics_sock).start()
    listener = await Listener.start(router, sock)
    tune_gc()
    try:
        metrics_url = _url(metrics_sock)
        log.info("metrics at %s/metrics", metrics_url)
        if announce:
            print(f"METRICS {metrics_url}", flush=True)
            print(f"READY {_url(sock)}", flush=True)
        await stop.wait()
    finally:
        await listener.close()
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
        uvloop.run(serve(config, secret, bind_socket(config.listen.host, config.listen.port),
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
            uvloop.run(serve(config, secret, child_sock, metrics_socket(config, index),
                              announce=False))
            os._exit(0)
        children.append(pid)
    try:
        uvloop.run(serve(config, secret, sock, metrics_socket(config, 0)))
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
