"""A discovered pod's model lookup (``router.fleet.discovery.lookup.served_model``) reads
a bounded answer within its timeout, against real servers on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from router.fleet.discovery.lookup import MAX_MODELS_BYTES, served_model
from tests.router.fleet.discovery.test_discovery_trust import silent_server

pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def models_server(body: bytes) -> AsyncIterator[str]:
    """A server whose ``/v1/models`` answers ``body`` (streamed, no length); its URL."""
    async def models(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for start in range(0, len(body), 1 << 16):
            await response.write(body[start:start + (1 << 16)])
        return response

    app = web.Application()
    app.add_routes([web.get("/v1/models", models)])
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def listing(*names: str, padding: int = 0) -> bytes:
    """A ``/v1/models`` answer listing ``names``, padded with ``padding`` spaces."""
    return json.dumps({"data": [{"id": n} for n in names]}).encode() + b" " * padding


async def test_the_first_model_of_this_router_is_found_and_a_long_answer_is_none():
    async with aiohttp.ClientSession() as session:
        async with models_server(listing("other", "demo")) as url:
            assert await served_model(session, url, {}, 1.0, ["demo"]) == "demo"
            assert await served_model(session, url, {}, 1.0, ["nope"]) is None
        async with models_server(listing("demo", padding=MAX_MODELS_BYTES)) as url:
            assert await served_model(session, url, {}, 1.0, ["demo"]) is None
        async with models_server(b"not json") as url:
            assert await served_model(session, url, {}, 1.0, ["demo"]) is None


async def test_a_pod_that_never_answers_is_no_answer_after_the_timeout():
    async with aiohttp.ClientSession() as session, silent_server() as (port, accepted):
        loop = asyncio.get_running_loop()
        start = loop.time()
        assert await served_model(session, f"http://127.0.0.1:{port}", {}, 0.3,
                                  ["demo"]) is None
        assert accepted and loop.time() - start < 2.0
