"""Probes read a worker's answers with a bound: a worker (or whatever answers at its
address) cannot make the router buffer an endless /ready."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from router.fleet.probes import MAX_PROBE_BYTES, probe_radix
from router.models import Models
from tests.support.aio import TEST_SECRET, serving
from tests.support.router_configs import make_config

pytestmark = pytest.mark.anyio


async def _endless_ready(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse()
    await response.prepare(request)
    chunk = b" " * 65536
    for _ in range(MAX_PROBE_BYTES // len(chunk) + 8):
        await response.write(chunk)
    return response


async def test_an_answer_past_the_bound_fails_the_probe_unread() -> None:
    app = web.Application()
    app.router.add_get("/ready", _endless_ready)
    models = Models.from_config(make_config(["http://127.0.0.1:9"]).models)
    async with serving(app) as url, aiohttp.ClientSession() as session:
        result = await probe_radix(session, url, {}, 10.0, models.get("demo"), TEST_SECRET)
    assert not result.ready
    assert f"an answer over {MAX_PROBE_BYTES} bytes" in result.reason
