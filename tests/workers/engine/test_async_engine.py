"""The engine thread bridge: streams, cancellation from the loop, failures, queue bound."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from tests.workers.engine.engine_support import prompt, request, run_async, used_blocks
from workers.engine.async_engine import AsyncEngine, QueueFullError
from workers.engine.request import EngineError
from workers.server.errors import ApiError
from workers.server.streaming import collect


def test_streams_run_concurrently_and_finish_with_usage():
    async def test(bridge: AsyncEngine):
        streams = [bridge.submit(request(prompt(20, salt=i), max_tokens=5)) for i in range(4)]
        results = await asyncio.gather(*(s.token_ids() for s in streams))
        assert [len(r) for r in results] == [5] * 4
        assert bridge.num_in_flight == 0 and bridge.stats.num_requests_running == 0
        assert await bridge.call(used_blocks) == 0

    run_async(test)


def test_closing_a_stream_aborts_the_request_and_frees_its_blocks():
    async def test(bridge: AsyncEngine):
        stream = bridge.submit(request(prompt(40), max_tokens=900))
        first = await anext(stream)
        assert first.deltas and not first.finished
        assert await bridge.call(used_blocks) > 0
        stream.close()
        assert await bridge.call(used_blocks) == 0, "released by the next command boundary"
        assert await bridge.call(lambda engine: engine.has_work()) is False

    run_async(test)


def test_a_failing_step_fails_its_requests_and_the_engine_carries_on():
    async def test(bridge: AsyncEngine):
        good = request(prompt(20), max_tokens=3)
        broken = dataclasses.replace(good, num_public_tokens=5)  # bypasses server validation
        with pytest.raises(EngineError):
            await bridge.submit(broken).token_ids()
        assert await bridge.call(used_blocks) == 0
        assert len(await bridge.submit(good).token_ids()) == 3
        assert not bridge.failed

    run_async(test)


def test_submit_beyond_the_bound_is_refused():
    async def test(bridge: AsyncEngine):
        streams = [bridge.submit(request(prompt(10), max_tokens=2)) for _ in range(2)]
        with pytest.raises(QueueFullError):
            bridge.submit(request(prompt(10), max_tokens=2))
        await asyncio.gather(*(s.token_ids() for s in streams))

    run_async(test, max_in_flight=2)


def test_a_request_for_an_adapter_gone_before_it_was_queued_is_a_404_not_a_500():
    """The server checks the adapter name, then the engine thread queues the request:
    an unload in between reaches the engine as an unknown adapter (here: LoRA off, so
    every adapter name is unknown). The client gets a 404 and nothing is held."""

    async def test(bridge: AsyncEngine):
        gone = dataclasses.replace(request(prompt(20), max_tokens=3), adapter="unloaded")
        with pytest.raises(ApiError) as refused:
            await collect(bridge, gone, timeout_s=30)
        assert (refused.value.status, refused.value.code) == (404, "model_not_found")
        assert bridge.num_in_flight == 0 and await bridge.call(used_blocks) == 0
        assert len(await bridge.submit(request(prompt(20), max_tokens=3)).token_ids()) == 3

    run_async(test)
