"""In-process aiohttp servers on loopback for tests: the router app and small upstreams.

``serving(app)`` runs any ``web.Application`` on a free loopback port the way the
router runs (``handler_cancellation`` on) and yields its base URL. ``running_router``
builds a real ``Router`` from a config and serves it as the router process does
(``router.server.serve.Listener``: the lean HTTP/1.1 server, aiohttp behind it). Plain module, no pytest.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from harness import instant_upstream
from router.config import RouterConfig
from router.context import Router, shared_backends
from router.server.app import bind_socket
from router.server.serve import Listener
from router.state.shared_state import InProcessSharedState

TEST_SECRET = b"radix-router-test-secret"


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """Serve ``app`` on 127.0.0.1:<free port> until the block ends; yields the URL.
    Leaving the block closes open connections within 0.2 s, like a killed server."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           shutdown_timeout=0.2)
    await runner.setup()
    sock = bind_socket("127.0.0.1", 0)
    try:
        await web.SockSite(runner, sock).start()
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def running_router(config: RouterConfig, wait_ready_s: float = 10.0,
                         shared: bool = False) -> AsyncIterator[tuple[str, Router]]:
    """A real router for ``config``; waits until every configured worker is ready
    (when there are any) and yields (URL, Router). With ``shared`` its limits and
    siblings are ``config.redis``'s (``shared_backends``), else in process."""
    state, siblings = shared_backends(config) if shared else (InProcessSharedState(), None)
    router = Router.build(config, TEST_SECRET, state, siblings)
    sock = bind_socket("127.0.0.1", 0)
    listener = await Listener.start(router, sock)
    try:
        await eventually(lambda: all(w.ready for w in router.registry.workers()), wait_ready_s,
                         describe=lambda: {w.worker_id: w.reason for w in router.registry.workers()})
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", router
    finally:
        await listener.close()


async def eventually(check, timeout_s: float = 10.0, interval_s: float = 0.05,
                     describe=lambda: None):
    """Poll ``check()`` (sync or async) until it returns a truthy value; returns it.
    AssertionError with the last value and ``describe()`` on timeout."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met in {timeout_s}s (last value {value!r}): "
                                 f"{describe()}")
        await asyncio.sleep(interval_s)


def key_recording_upstream(seen: list[str]) -> web.Application:
    """An instant upstream that records every Authorization header it is sent."""
    @web.middleware
    async def record(request: web.Request, handler):
        seen.append(request.headers.get("Authorization", ""))
        return await handler(request)

    app = web.Application(middlewares=[record])
    app.add_routes(instant_upstream.status_routes())
    return app
