"""The per-request trace: one JSON line per finished request on ``worker.trace`` with
its KV dtype, cached tokens by medium, blocks evicted to admit it and preemptions."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace

import pytest

from tests.workers.engine.engine_support import make_engine, prompt, request, run
from workers.build import build_worker
from workers.config import ModelSettings, WorkerConfig
from workers.engine.engine import Engine
from workers.server.streaming import collect


def traces(caplog: pytest.LogCaptureFixture) -> dict[object, dict]:
    """The trace lines logged so far, by request id."""
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "worker.trace"]
    return {line["request_id"]: line for line in lines}


def run_one(engine: Engine, request_id: int, length: int, salt: int = 0) -> None:
    run(engine, {request_id: request(prompt(length, salt), max_tokens=1)})


def test_cached_tokens_by_medium_and_the_blocks_evicted_to_admit(caplog):
    caplog.set_level(logging.INFO, logger="worker.trace")
    engine = make_engine(num_blocks=4, num_host_blocks=16)
    run_one(engine, 1, 40)  # 3 blocks, cached when it finishes
    run_one(engine, 2, 40, salt=1)  # evicts request 1's leaf; its 2 full blocks go to the host
    run_one(engine, 3, 48)  # request 1's prompt + 8: both full blocks come back from the host
    lines = traces(caplog)
    dtype = engine.manager.tensors.spec.dtype
    assert lines[1] == {"request_id": 1, "kv_dtype": dtype, "prompt_tokens": 40,
                        "completion_tokens": 1, "cached_tokens": {"device": 0, "host": 0},
                        "evicted_blocks": 0, "preemptions": 0, "finish_reasons": ["length"]}
    assert (lines[2]["cached_tokens"], lines[2]["evicted_blocks"]) == ({"device": 0, "host": 0}, 3)
    assert (lines[3]["cached_tokens"], lines[3]["evicted_blocks"]) == ({"device": 0, "host": 32}, 3)


def test_preemptions_are_charged_to_their_requests(caplog):
    caplog.set_level(logging.INFO, logger="worker.trace")
    engine = make_engine(num_blocks=7)
    run(engine, {i: request(prompt(24, salt=i), max_tokens=24) for i in range(4)})
    lines = traces(caplog)
    assert sorted(lines) == [0, 1, 2, 3]
    assert sum(line["preemptions"] for line in lines.values()) == engine.scheduler.num_preemptions > 0


def test_the_callers_request_id_is_traced(caplog):
    caplog.set_level(logging.INFO, logger="worker.trace")
    engine = make_engine()
    run(engine, {7: replace(request(prompt(20), max_tokens=2), request_id="router-abc")})
    assert list(traces(caplog)) == ["router-abc"]


def test_a_timed_worker_traces_its_profiles_kv_dtype_not_its_placeholder_tensors(caplog):
    caplog.set_level(logging.INFO, logger="worker.trace")
    config = WorkerConfig(model=ModelSettings(name="timed:llama3-8b-h100", time_scale=0.01))
    built = build_worker(config, "w", b"secret")

    async def main() -> None:
        built.engine.start(asyncio.get_running_loop())
        try:
            await collect(built.engine, request(prompt(20), max_tokens=2), 30)
        finally:
            built.engine.stop()

    asyncio.run(main())
    assert [line["kv_dtype"] for line in traces(caplog).values()] == ["bfloat16"]
    assert built.identity.kv_plan.spec.dtype == "bfloat16"
