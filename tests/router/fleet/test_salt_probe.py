"""An OpenAI-compatible backend that ignores ``cache_salt`` is never routed to tenants,
nor one whose isolation cannot be checked unless its entry trusts it.

Fake backends on loopback report ``cached_tokens`` for a repeated prompt: one keyed
by (salt, prompt) like vLLM, one by the prompt alone like an engine that ignores the
salt; others report no ``cached_tokens`` (vLLM without
``--enable-prompt-tokens-details``) or fail the probe. The router checks each as it
becomes ready (``router.fleet.salt_probe``).
"""

from __future__ import annotations

import pytest
from aiohttp import web

from harness import instant_upstream
from router.context import Router
from router.server.app import create_app
from router.state.shared_state import InProcessSharedState
from tests.support.aio import TEST_SECRET, eventually, serving
from tests.support.router_configs import make_config

pytestmark = pytest.mark.anyio


def caching_backend(honours_salt: bool, reports_cached: bool = True,
                    status: int = 200) -> web.Application:
    """Answers completions (with ``status``) with ``cached_tokens`` = the prompt's
    length when it saw the prompt before (under the same salt, if it
    ``honours_salt``); without ``reports_cached`` the usage has no such field."""
    seen: set[tuple[str | None, tuple[int, ...]]] = set()

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        key = (body.get("cache_salt") if honours_salt else None, tuple(body["prompt"]))
        cached = len(key[1]) if key in seen else 0
        seen.add(key)
        usage: dict[str, object] = {"prompt_tokens": len(key[1]), "completion_tokens": 1}
        if reports_cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return web.json_response({"object": "text_completion", "choices": [
            {"index": 0, "text": "x", "finish_reason": "length"}], "usage": usage},
            status=status)

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "demo"}]})

    app = web.Application()
    app.add_routes([*instant_upstream.status_routes(), web.get("/v1/models", models),
                    web.post("/v1/completions", completions)])
    return app


@pytest.mark.parametrize("honours_salt", [True, False])
async def test_a_backend_is_routed_only_if_it_keeps_salts_apart(honours_salt) -> None:
    async with serving(caching_backend(honours_salt)) as up:
        router = Router.build(make_config([up], kind="openai"), TEST_SECRET,
                              InProcessSharedState())
        async with serving(create_app(router)):
            (worker,) = router.registry.workers()
            await eventually(lambda: worker.reason != "not probed yet")
            if honours_salt:
                assert worker.ready
            else:
                assert not worker.ready
                assert worker.reason.startswith("ignores cache_salt")
                assert router.registry.routable("demo") == []


@pytest.mark.parametrize("trusted", [False, True])
async def test_a_backend_that_reports_no_cache_hits_is_routed_only_if_trusted(trusted) -> None:
    async with serving(caching_backend(honours_salt=False, reports_cached=False)) as up:
        router = Router.build(make_config([up], kind="openai", worker={"trust_cache_salt": trusted}), TEST_SECRET,
                              InProcessSharedState())
        async with serving(create_app(router)):
            (worker,) = router.registry.workers()
            await eventually(lambda: worker.reason != "not probed yet")
            assert worker.ready == trusted
            if not trusted:
                assert worker.reason.startswith("reports no cached_tokens")


async def test_a_backend_that_fails_the_probe_is_not_routed_until_it_answers() -> None:
    async with serving(caching_backend(honours_salt=True, status=500)) as up:
        router = Router.build(make_config([up], kind="openai"), TEST_SECRET,
                              InProcessSharedState())
        async with serving(create_app(router)):
            (worker,) = router.registry.workers()
            await eventually(lambda: worker.reason.startswith("cache_salt probe failed"))
            assert not worker.ready and router.registry.routable("demo") == []


async def test_a_trusted_backend_that_fails_the_probe_is_routed() -> None:
    async with serving(caching_backend(honours_salt=True, status=500)) as up:
        router = Router.build(make_config([up], kind="openai",
                                          worker={"trust_cache_salt": True}),
                              TEST_SECRET, InProcessSharedState())
        async with serving(create_app(router)):
            (worker,) = router.registry.workers()
            await eventually(lambda: worker.ready)
