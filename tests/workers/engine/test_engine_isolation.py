"""One bad request fails alone; a failed batch drops readiness until the self-test
passes again; a dead engine thread is visible; failed steps and out-of-memory errors
are counted on ``/metrics``.

The bad requests are built here the way only a validation gap would let them through
(the HTTP layer refuses them): each fails in a real code path of the real engine.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch
from prometheus_client import CollectorRegistry

from tests.workers.engine.engine_support import demo_model, prompt, request, run_async, used_blocks
from workers.engine.async_engine import AsyncEngine
from workers.engine.engine import Engine
from workers.engine.metrics import register_stats
from workers.engine.request import EngineError, GenerationParams
from workers.engine.selftest import keep_ready
from workers.model.sampler import SamplingParams

NUM_GOOD = 8


def good_requests():
    return [request(prompt(24 + i, salt=i), max_tokens=12) for i in range(NUM_GOOD)]


def overflowing_top_k():
    """Sampling parameters torch cannot turn into a tensor: the batched sampler raises."""
    good = request(prompt(30, salt=99), max_tokens=12)
    sampling = SamplingParams(temperature=1.0, top_k=2**63, max_tokens=12, ignore_eos=True)
    return dataclasses.replace(good, params=GenerationParams(sampling))


def bytes_stop_string():
    """A stop "string" that is bytes: detokenizing its first token raises."""
    good = request(prompt(30, salt=98), max_tokens=12)
    return dataclasses.replace(good, params=dataclasses.replace(good.params, stop=(b"ab",)))


def expected_tokens() -> list[list[int]]:
    async def alone(bridge: AsyncEngine) -> None:
        for req in good_requests():
            results.append(await bridge.submit(req).token_ids())

    results: list[list[int]] = []
    run_async(alone)
    return results


@pytest.mark.parametrize("bad", [overflowing_top_k, bytes_stop_string])
def test_one_failing_request_leaves_eight_streams_untouched(bad):
    expected = expected_tokens()

    async def test(bridge: AsyncEngine):
        streams = [bridge.submit(req) for req in good_requests()]
        broken = bridge.submit(bad())
        results = await asyncio.gather(*(s.token_ids() for s in streams), broken.token_ids(),
                                       return_exceptions=True)
        assert results[:NUM_GOOD] == expected
        assert isinstance(results[-1], EngineError) and "for this request" in str(results[-1])
        assert await bridge.call(used_blocks) == 0
        assert not bridge.failed and not bridge.batch_failed.is_set()

    run_async(test, max_in_flight=NUM_GOOD + 1)


class RecordingEvent(asyncio.Event):
    """An asyncio.Event that counts how often it was cleared."""

    num_clears = 0

    def clear(self) -> None:
        self.num_clears += 1
        super().clear()


def test_a_failed_batch_aborts_it_and_readiness_returns_after_a_self_test():
    vocab_size = demo_model().config.vocab_size

    async def test(bridge: AsyncEngine):
        ready = RecordingEvent()
        ready.set()
        keeper = asyncio.create_task(keep_ready(bridge, ready, vocab_size, 16, retry_s=0.05))
        try:
            neighbour = bridge.submit(request(prompt(20), max_tokens=50))
            await anext(neighbour)
            out_of_vocab = request((vocab_size + 5,) * 20, max_tokens=2)  # the forward raises
            with pytest.raises(EngineError):
                await bridge.submit(out_of_vocab).token_ids()
            with pytest.raises(EngineError):
                await neighbour.token_ids()  # the whole batch failed with it
            await asyncio.wait_for(_until(lambda: ready.num_clears and ready.is_set()), 30)
            assert ready.num_clears == 1 and not bridge.failed
            assert len(await bridge.submit(request(prompt(20), max_tokens=3)).token_ids()) == 3
            assert await bridge.call(used_blocks) == 0
            assert (bridge.stats.engine_failed_steps_total,
                    bridge.stats.engine_out_of_memory_total) == (1, 0)
        finally:
            keeper.cancel()

    run_async(test)


def out_of_memory() -> torch.OutOfMemoryError:
    """What the CUDA caching allocator raises when the device has no room left."""
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def counters(bridge: AsyncEngine) -> dict[str, float | None]:
    """The failure counters as ``/metrics`` exposes them."""
    registry = CollectorRegistry()
    register_stats(registry, lambda: bridge.stats)
    return {name: registry.get_sample_value(name)
            for name in ("engine_failed_steps_total", "engine_out_of_memory_total")}


def test_a_step_out_of_memory_fails_its_requests_is_counted_and_the_engine_goes_on():
    def run_out_of_memory_once(engine: Engine) -> None:
        def execute(inputs):
            del engine._runner.execute  # the next step runs the model again
            raise out_of_memory()

        engine._runner.execute = execute

    async def test(bridge: AsyncEngine):
        assert counters(bridge) == {"engine_failed_steps_total": 0,
                                    "engine_out_of_memory_total": 0}
        await bridge.call(run_out_of_memory_once)
        with pytest.raises(EngineError):
            await bridge.submit(request(prompt(20), max_tokens=4)).token_ids()
        await asyncio.wait_for(_until(lambda: counters(bridge)["engine_failed_steps_total"]), 30)
        assert counters(bridge) == {"engine_failed_steps_total": 1,
                                    "engine_out_of_memory_total": 1}
        assert len(await bridge.submit(request(prompt(20), max_tokens=4)).token_ids()) == 4
        assert await bridge.call(used_blocks) == 0 and not bridge.failed

    run_async(test)


def test_one_request_out_of_memory_fails_alone_and_is_counted_but_not_as_a_failed_step():
    victim = request(prompt(30, salt=97), max_tokens=12)

    def run_out_of_memory_on_the_victim(engine: Engine) -> None:
        step_input = engine._step_input

        def prepare(chunk):
            if chunk.seq.request.request is victim:
                raise out_of_memory()
            return step_input(chunk)

        engine._step_input = prepare

    expected = expected_tokens()

    async def test(bridge: AsyncEngine):
        await bridge.call(run_out_of_memory_on_the_victim)
        streams = [bridge.submit(req) for req in good_requests()]
        results = await asyncio.gather(*(s.token_ids() for s in streams),
                                       bridge.submit(victim).token_ids(), return_exceptions=True)
        assert results[:NUM_GOOD] == expected
        assert isinstance(results[-1], EngineError) and "preparing its inputs" in str(results[-1])
        await asyncio.wait_for(_until(lambda: counters(bridge)["engine_out_of_memory_total"]), 30)
        assert counters(bridge) == {"engine_failed_steps_total": 0,
                                    "engine_out_of_memory_total": 1}

    run_async(test, max_in_flight=NUM_GOOD + 1)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_dead_engine_thread_is_reported_and_refuses_work():
    async def test(bridge: AsyncEngine):
        def die(engine) -> None:
            raise SystemExit("the engine thread stops here")

        asyncio.ensure_future(bridge.call(die))
        await asyncio.wait_for(_until(lambda: bridge.failed), 30)
        with pytest.raises(EngineError):
            bridge.submit(request(prompt(10), max_tokens=2))

    run_async(test)


async def _until(check) -> None:
    while not check():
        await asyncio.sleep(0.01)
