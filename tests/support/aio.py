"""In-process aiohttp servers on loopback for tests: the router app, small upstreams,
and the calls tests make to them.

``serving(app)`` runs any ``web.Application`` on a free loopback port the way the
router runs (``handler_cancellation`` on) and yields its base URL. ``running_router``
builds a real ``Router`` from a config and serves it as the router process does
(``router.server.serve.Listener``: the lean HTTP/1.1 server, aiohttp behind it). Plain
module, no pytest.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web

from harness import instant_upstream
from router.config import RouterConfig
from router.context import Router, shared_backends
from router.server.app import bind_socket
from router.server.serve import Listener
from router.state.shared_state import InProcessSharedState
from tests.support import router_configs

TEST_SECRET = b"radix-router-test-secret"
# The Authorization headers of tenant alice and of the admin (router_configs' keys).
ALICE = {"Authorization": f"Bearer {router_configs.ALICE}"}
ADMIN = {"Authorization": f"Bearer {router_configs.ADMIN}"}


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
    siblings (and flow shares) are ``config.redis``'s (``shared_backends``), else in
    process."""
    state, siblings, shares = (shared_backends(config) if shared
                               else (InProcessSharedState(), None, None))
    router = Router.build(config, TEST_SECRET, state, siblings, shares)
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


def failing_upstream(status: int) -> web.Application:
    """An instant upstream whose ``/generate`` always answers ``status`` (an OpenAI
    error body)."""
    async def generate(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "boom", "type": "server_error",
                                            "param": None, "code": None}}, status=status)

    app = web.Application()
    app.add_routes([*instant_upstream.status_routes(), web.post("/generate", generate)])
    return app


NOTHING_CACHED = {"object": "text_completion", "choices": [
    {"index": 0, "text": "x", "finish_reason": "length"}], "usage": {
    "prompt_tokens": 1, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 0}}}


def scripted_stream(pieces: list[bytes]):
    """A handler whose stream is ``pieces``, each sent on its own after a short pause
    (so each is a separate network read on the router's side). A request that does
    not ask for a stream (the router's ``cache_salt`` probe) gets a one-token answer
    from an engine that caches nothing."""
    async def handler(request: web.Request) -> web.StreamResponse:
        if not (await request.json()).get("stream"):
            return web.json_response(NOTHING_CACHED)
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for piece in pieces:
            await out.write(piece)
            await asyncio.sleep(0.005)
        return out

    return handler


async def call(session: aiohttp.ClientSession, method: str, url: str, body: Any = None,
               headers: dict[str, str] | None = None) -> tuple[int, Any, Any]:
    """One request (``body`` as JSON, or raw bytes); (status, JSON answer or its text,
    response headers)."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body)
    async with session.request(method, url, data=data, headers=headers) as resp:
        text = await resp.text()
        try:
            return resp.status, json.loads(text), resp.headers
        except ValueError:
            return resp.status, text, resp.headers


async def post(session: aiohttp.ClientSession, url: str, body: Any,
               headers: dict[str, str]) -> tuple[int, Any]:
    """POST ``body`` as JSON; (status, JSON answer), the answer must be JSON."""
    async with session.post(url, json=body, headers=headers) as resp:
        return resp.status, await resp.json()
