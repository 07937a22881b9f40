"""``router_refused_requests_total{reason}``: each refusal the router makes, driven
through a real router app in this process, is counted under its reason once; a
worker's failure is not a refusal."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from harness import instant_upstream
from router.context import Router
from router.metrics import REFUSAL_REASONS
from tests.support.aio import ALICE, call, failing_upstream, running_router, serving
from tests.support.router_configs import make_config

pytestmark = pytest.mark.anyio


def refusals(router: Router) -> dict[str, float]:
    """The refusals counted so far, by reason (every reason is exported from the start)."""
    counts = {reason: router.metrics.registry.get_sample_value(
        "router_refused_requests_total", {"reason": reason}) for reason in REFUSAL_REASONS}
    assert None not in counts.values(), counts
    return {reason: count for reason, count in counts.items() if count}


async def test_each_refusal_is_counted_under_its_reason() -> None:
    async with serving(instant_upstream.create_app()) as up, \
            running_router(make_config([up], max_concurrent_requests=1, tokens_per_minute=60,
                                       max_prompt_tokens=16, max_output_tokens=8)
                           ) as (url, router), \
            aiohttp.ClientSession() as session:
        alice = router.auth.tenant(ALICE["Authorization"])
        body = {"model": "demo", "prompt": "abc", "max_tokens": 2}

        async def too_large():
            """A body over the key's bound, still arriving when the router bounds it."""
            yield b'{"model": "demo", "prompt": "'
            await asyncio.sleep(0.2)
            yield b"x" * router.models.max_body_bytes(alice.limits) + b'"}'

        async def refused(payload, headers=ALICE) -> tuple[int, str]:
            status, answer, _ = await call(session, "POST", f"{url}/v1/completions", payload,
                                           headers)
            return status, answer["error"]["code"]

        assert refusals(router) == {}
        assert await refused(body, {"Authorization": "Bearer no"}) == (401, "invalid_api_key")
        assert await refused(b"{not json") == (400, "invalid_json")
        assert await refused({**body, "prompt": "x" * 40}) == (413, "prompt_too_long")
        assert await refused({**body, "max_tokens": 9}) == (400, "max_tokens_too_large")
        async with session.post(f"{url}/v1/completions", data=too_large(), headers=ALICE) as r:
            assert (r.status, (await r.json())["error"]["code"]) == (413, "request_too_large")
        held = await router.limiter.admit(alice, 1, 0)            # the one slot, taken
        assert await refused(body) == (429, "concurrency_limit")
        await router.limiter.release(held, 59)                    # the minute's tokens, spent
        assert await refused(body) == (429, "rate_limit_exceeded")
        assert refusals(router) == {
            "invalid_api_key": 1, "invalid_request": 1, "prompt_too_long": 1,
            "max_tokens_too_large": 1, "request_too_large": 1, "concurrency_limit": 1,
            "rate_limit_exceeded": 1}
        assert router.metrics.registry.get_sample_value(
            "router_requests_total", {"worker": "none", "tenant": "alice", "code": "429"}) == 2


async def test_no_worker_and_saturated_are_refusals_and_a_failed_worker_is_not() -> None:
    body = {"model": "demo", "prompt": "abc", "max_tokens": 2}
    async with running_router(make_config([])) as (url, router), \
            aiohttp.ClientSession() as session:
        status, error, _ = await call(session, "POST", f"{url}/v1/completions", body, ALICE)
        assert (status, error["error"]["code"]) == (503, "no_worker")
        assert refusals(router) == {"no_worker": 1}
    for upstream_status, answer, counted in ((429, (503, "saturated"), {"saturated": 1}),
                                             (500, (502, "upstream_error"), {})):
        async with serving(failing_upstream(upstream_status)) as up, \
                running_router(make_config([up])) as (url, router), \
                aiohttp.ClientSession() as session:
            status, error, _ = await call(session, "POST", f"{url}/v1/completions", body, ALICE)
            assert (status, error["error"]["code"]) == answer
            assert refusals(router) == counted
