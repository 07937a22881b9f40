"""The start-up self-test that gates ``/ready``.

It runs a short greedy request through the real engine (prefill of a few blocks,
then decode), then a second request whose prompt is the first prompt plus half of
the generated tokens: its prefix comes from the prefix cache and its prefill runs
over positions the first request decoded. It passes when both produce the
requested number of in-vocabulary tokens and, once they finish, the KV manager's
invariants hold with no block left in use. A disagreement between the second
continuation and the first is logged, not fatal: reduced-precision kernels may
legitimately flip a near-tie.

``keep_ready`` runs for the worker's life after the start-up self-test: when a
batched step fails, readiness drops until the self-test passes again, so routers
stop sending work to a worker whose model call just broke.
"""

from __future__ import annotations

import asyncio
import logging

from workers.engine.async_engine import AsyncEngine
from workers.engine.engine import Engine
from workers.engine.request import EngineError, GenerationParams, GenerationRequest
from workers.model.sampler import SamplingParams

log = logging.getLogger(__name__)
SELF_TEST_SCOPE = "selftest"
_NUM_TOKENS = 4


class SelfTestError(RuntimeError):
    """The engine failed its start-up self-test; the worker must not become ready."""


async def run_self_test(engine: AsyncEngine, vocab_size: int, block_size: int) -> None:
    """Run the self-test (see the module docstring); raises ``SelfTestError``."""
    prompt = tuple((7 * i + 3) % min(vocab_size, 256) for i in range(2 * block_size + 3))
    first = await _generate(engine, prompt, _NUM_TOKENS, vocab_size)
    half = _NUM_TOKENS // 2
    second = await _generate(engine, prompt + first[:half], _NUM_TOKENS - half, vocab_size)
    if second != first[half:]:
        log.warning("self-test: prefill after decode disagrees (%s vs %s)", second, first[half:])
    await engine.call(_check_idle)
    log.info("self-test passed: %s", list(first))


async def keep_ready(engine: AsyncEngine, ready: asyncio.Event, vocab_size: int,
                     block_size: int, retry_s: float = 1.0) -> None:
    """Forever (cancel to stop): after each batched-step failure clear ``ready``, rerun
    the self-test every ``retry_s`` until it passes, then set ``ready`` again."""
    while True:
        await engine.batch_failed.wait()
        ready.clear()
        log.warning("a batched step failed: not ready until the self-test passes again")
        while True:
            engine.batch_failed.clear()
            try:
                await run_self_test(engine, vocab_size, block_size)
                break
            except (SelfTestError, EngineError) as exc:
                log.error("self-test after a failed step: %s; retrying in %g s", exc, retry_s)
                await asyncio.sleep(retry_s)
        if not engine.batch_failed.is_set():
            ready.set()


async def _generate(
    engine: AsyncEngine, prompt: tuple[int, ...], num_tokens: int, vocab_size: int
) -> tuple[int, ...]:
    params = GenerationParams(SamplingParams(temperature=0.0, max_tokens=num_tokens, ignore_eos=True))
    stream = engine.submit(GenerationRequest(prompt, params, scope=SELF_TEST_SCOPE))
    token_ids = await stream.token_ids()
    if len(token_ids) != num_tokens or not all(0 <= t < vocab_size for t in token_ids):
        raise SelfTestError(f"self-test: expected {num_tokens} tokens below {vocab_size}, got {token_ids}")
    return tuple(token_ids)


def _check_idle(engine: Engine) -> None:
    try:
        engine.manager.check_invariants()
    except AssertionError as exc:
        raise SelfTestError(f"self-test: KV invariants broken: {exc}") from exc
    if engine.manager.stats().num_used_blocks:
        raise SelfTestError("self-test: blocks still in use after every request finished")
