"""The learn step's prediction check (``router.fleet.cache_prediction``,
``router.dispatch.check_prediction``): the outcome of whole reusable blocks, and, on a
real router app in this process, each checked request counted under its outcome in
``/admin/workers``, ``/metrics`` and the access log, a request whose worker reports no
``cached_tokens`` in none of them, and a request sent for a prefix another request is
still computing counted ``in_flight`` until that request's first token."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from harness import instant_upstream
from router.fleet.cache_prediction import (
    EXACT,
    IN_FLIGHT,
    OUTCOMES,
    OVER,
    UNDER,
    prediction_outcome,
    reusable_tokens,
)
from tests.support.aio import ADMIN, ALICE, call, eventually, running_router, serving
from tests.support.metric_samples import sample
from tests.support.router_configs import make_config

B = 16


@pytest.mark.parametrize(("num_tokens", "num_prompt_tokens", "reusable"), [
    (0, 40, 0), (15, 40, 0), (16, 40, 16), (39, 40, 32), (40, 40, 32),
    (48, 48, 32),    # the prompt's last token is computed, so its last block is not reused
    (49, 49, 48), (100, 49, 48), (0, 1, 0), (5, 0, 0),
    (256, 300, 256),  # a vLLM match, cut to blocks already, stays as it is
])
def test_reusable_tokens_are_whole_blocks_before_the_last_token(
        num_tokens: int, num_prompt_tokens: int, reusable: int) -> None:
    assert reusable_tokens(num_tokens, num_prompt_tokens, B) == reusable


@pytest.mark.parametrize(("predicted", "confirmed", "served", "outcome"), [
    (32, 32, 32, EXACT), (0, 0, 0, EXACT),
    (48, 48, 32, OVER), (32, 32, 0, OVER),
    (0, 0, 16, UNDER), (32, 0, 48, UNDER),
    (48, 16, 16, IN_FLIGHT),   # served the confirmed part: the rest was still computing
    (48, 0, 0, IN_FLIGHT), (48, 16, 32, IN_FLIGHT),
    (48, 32, 16, OVER),        # served less than the confirmed part: a silent miss
    (48, 16, 0, OVER),
    (48, 0, 48, EXACT),        # the request in flight was done in time
])
def test_outcome_weighs_served_against_predicted_and_its_confirmed_part(
        predicted: int, confirmed: int, served: int, outcome: str) -> None:
    assert prediction_outcome(predicted, confirmed, served) == outcome


def scripted_openai(reports: list[int | None],
                    gates: list[asyncio.Event | None] | None = None) -> web.Application:
    """An OpenAI-compatible upstream (kind ``openai``) whose answers report, in turn,
    the ``cached_tokens`` of ``reports`` (None: no ``prompt_tokens_details``; also
    when ``reports`` is empty, as for the router's ``cache_salt`` probe), whole or
    streamed; the request that takes a report first waits for the next of ``gates``
    (None: not at all)."""
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        reported = reports.pop(0) if reports else None
        gate = gates.pop(0) if reported is not None and gates else None
        if gate is not None:
            await gate.wait()
        usage: dict[str, Any] = {"prompt_tokens": len(body["prompt"]), "completion_tokens": 1}
        if reported is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": reported}
        choice = {"index": 0, "text": "a", "finish_reason": "length"}
        if not body.get("stream"):
            return web.json_response({"object": "text_completion", "choices": [choice],
                                      "usage": usage})
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for chunk in ({"choices": [choice]}, {"choices": [], "usage": usage}):
            await out.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await out.write(b"data: [DONE]\n\n")
        return out

    app = web.Application()
    app.add_routes([*instant_upstream.status_routes(), web.get("/v1/models", instant_upstream.models),
                    web.post("/v1/completions", completions)])
    return app


def predictions(text: str, namespace: str) -> dict[str, float]:
    return {outcome: sample(text, "router_cache_predictions_total",
                            {"worker": "u0", "namespace": namespace, "outcome": outcome})
            for outcome in OUTCOMES}


def prediction_tokens(text: str) -> dict[str, float]:
    return {kind: sample(text, "router_cache_prediction_tokens_total", {"worker": "u0", "kind": kind})
            for kind in ("predicted", "in_flight", "served")}


@pytest.mark.anyio
async def test_each_checked_request_is_counted_under_its_outcome(caplog) -> None:
    caplog.set_level(logging.INFO, logger="router.access")
    reports: list[int | None] = []
    prompt = "Prediction check: thirty-eight bytes!!"   # BOS + 38 bytes: 39 tokens
    other = "Another prompt the index never saw before, at all"
    async with serving(scripted_openai(reports)) as up, \
            running_router(make_config([up], kind="openai", worker={"trust_cache_salt": True})
                           ) as (url, router), \
            aiohttp.ClientSession() as session:

        async def ask(text: str, reported: int | None, chat: bool = False,
                      stream: bool = False) -> None:
            reports.append(reported)
            path, body = ("/v1/completions", {"prompt": text})
            if chat:
                path, body = "/v1/chat/completions", {"messages": [
                    {"role": "user", "content": text}]}
            status, answer, _ = await call(session, "POST", f"{url}{path}", {
                "model": "demo", "max_tokens": 1, "stream": stream, **body}, ALICE)
            assert status == 200, answer

        await ask(prompt, None)                      # unchecked: the worker reports none
        await ask("Chat " + prompt, None, chat=True)
        await ask("Streamed chat " + prompt, None, chat=True, stream=True)
        worker = router.registry.get("u0")
        assert worker.stats.to_dict()["exact_fraction"] is None
        assert router.metrics.registry.get_sample_value("router_cache_predictions_total", {
            "worker": "u0", "namespace": worker.namespace, "outcome": EXACT}) is None
        await ask(prompt, 38)       # predicted 32 (the prompt routed before), served 32
        await ask(prompt, 0)        # predicted 32, served nothing: the silent miss
        await ask(other, 20)        # predicted 0, served 16
        status, listed, _ = await call(session, "GET", f"{url}/admin/workers", None, ADMIN)
        stats = listed["workers"][0]["stats"]
        assert status == 200 and stats["num_requests"] == 6
        assert (stats["num_exact_predictions"], stats["num_over_predictions"],
                stats["num_under_predictions"]) == (1, 1, 1)
        assert stats["exact_fraction"] == pytest.approx(1 / 3)
        text = router.metrics.render([worker]).decode()
        assert predictions(text, worker.namespace) == {EXACT: 1, OVER: 1, UNDER: 1, IN_FLIGHT: 0}
        assert prediction_tokens(text) == {"predicted": 64, "in_flight": 0, "served": 48}
    outcomes = [r.getMessage().rsplit("outcome=", 1)[1] for r in caplog.records
                if r.name == "router.access"]
    assert outcomes == ["unchecked"] * 3 + [EXACT, OVER, UNDER]


@pytest.mark.anyio
async def test_a_prefix_another_request_is_still_computing_counts_in_flight_not_over() -> None:
    """An approximate worker's entry counts as confirmed from its request's first token:
    before it, a request routed there for the same prefix and not served it is
    ``in_flight``; after it, the same shortfall is a silent miss (``over``)."""
    prompt = "Prediction check: thirty-eight bytes!!"   # 39 tokens: 32 reusable
    release = asyncio.Event()
    reports: list[int | None] = []
    gates: list[asyncio.Event | None] = []
    async with serving(scripted_openai(reports, gates)) as up, \
            running_router(make_config([up], kind="openai", worker={"trust_cache_salt": True})
                           ) as (url, router), \
            aiohttp.ClientSession() as session:

        async def ask(reported: int) -> None:
            reports.append(reported)
            status, answer, _ = await call(session, "POST", f"{url}/v1/completions", {
                "model": "demo", "max_tokens": 1, "prompt": prompt}, ALICE)
            assert status == 200, answer

        worker = router.registry.get("u0")
        gates.append(release)
        first = asyncio.create_task(ask(0))     # held before its first token
        await eventually(lambda: worker.num_in_flight_requests == 1)
        await ask(0)    # predicted 32 by the held request's entry only, served 0
        release.set()
        await first     # predicted 0, served 0
        await ask(0)    # predicted 32, confirmed now, served 0: the silent miss
        stats = worker.stats.to_dict()
        assert (stats["num_exact_predictions"], stats["num_over_predictions"],
                stats["num_under_predictions"], stats["num_in_flight_predictions"]) == (1, 1, 0, 1)
        assert stats["exact_fraction"] == pytest.approx(1 / 2)
        text = router.metrics.render([worker]).decode()
        assert predictions(text, worker.namespace) == {EXACT: 1, OVER: 1, UNDER: 0, IN_FLIGHT: 1}
        assert prediction_tokens(text) == {"predicted": 64, "in_flight": 32, "served": 0}
