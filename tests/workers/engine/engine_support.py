"""In-process engines over the demo model with small KV caches, and a driver that
runs requests to completion checking the KV invariants after every step."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import torch
from prometheus_client import CollectorRegistry

from radix.cost_model import CostModel
from workers.build import kv_spec
from workers.config import EngineConfig
from workers.engine.async_engine import AsyncEngine
from workers.engine.engine import Engine
from workers.engine.kv_feed import KVEventFeed
from workers.engine.metrics import EngineMetrics
from workers.engine.request import GenerationParams, GenerationRequest, Usage
from workers.kv.build import build_kv_cache_manager
from workers.model.demo import ensure_demo_checkpoint
from workers.model.loader import LoadedModel, load_model
from workers.model.runner import ModelRunner
from workers.model.sampler import SamplingParams
from workers.model.timed import TimedRunner, timed_tensor_spec

BLOCK_SIZE = 16


@functools.cache
def demo_model() -> LoadedModel:
    """The demo model, loaded once per test process (it holds no per-engine state).

    Also pins torch to one CPU thread: the demo model's matrices are tiny, and two
    threads on a busy two-core machine make every step tens of times slower.
    """
    torch.set_num_threads(1)
    return load_model(ensure_demo_checkpoint())


def make_engine(
    num_blocks: int = 64,
    max_batched_tokens: int = 512,
    max_num_seqs: int = 64,
    prefix_caching: bool = True,
    registry: CollectorRegistry | None = None,
    num_host_blocks: int = 0,
    preemption_mode: str = "recompute",
    timed: CostModel | None = None,
    sleep: Callable[[float], None] | None = None,
    host_ttl_s: float | None = None,
) -> Engine:
    """An engine over a fresh KV cache of ``num_blocks`` blocks (and a host tier of
    ``num_host_blocks``, entries kept ``host_ttl_s``); its histograms go to
    ``registry`` (a fresh one by default). With ``timed``, the timed backend's runner over that cost model replaces the demo
    model's forward pass; it waits through ``sleep`` (a recorder in tests)."""
    loaded = demo_model()
    spec = kv_spec(loaded.config, BLOCK_SIZE) if timed is None else timed_tensor_spec(BLOCK_SIZE)
    manager = build_kv_cache_manager(
        spec, num_blocks, namespace_digest=b"engine-test", worker_id="engine-test",
        prefix_caching=prefix_caching, num_host_blocks=num_host_blocks, secret=b"engine-test",
        host_ttl_s=host_ttl_s,
    )
    runner: ModelRunner | TimedRunner
    if timed is None:
        runner = ModelRunner(
            loaded.model, manager.tensors.key_caches, manager.tensors.value_caches, BLOCK_SIZE
        )
    else:
        runner = TimedRunner(timed, loaded.config.vocab_size, range(97, 123), sleep=sleep or time.sleep)
    config = EngineConfig(max_batched_tokens=max_batched_tokens, max_num_seqs=max_num_seqs,
                          preemption_mode=preemption_mode)
    return Engine(
        manager, runner, loaded.tokenizer, config, min(4096, num_blocks * BLOCK_SIZE),
        EngineMetrics(registry or CollectorRegistry()),
    )


def prompt(length: int, salt: int = 0) -> tuple[int, ...]:
    """Deterministic byte-token prompt (ids below 256)."""
    return tuple((31 * i + 7 * salt + 11) % 251 for i in range(length))


def request(
    prompt_ids: tuple[int, ...], max_tokens: int = 8, *, temperature: float = 0.0,
    seed: int | None = None, n: int = 1, stop: tuple[str, ...] = (),
    stop_token_ids: tuple[int, ...] = (), ignore_eos: bool = True, scope: str = "anonymous",
    priority: int = 0,
) -> GenerationRequest:
    """A request with the given sampling (greedy, EOS ignored by default) and scheduling
    priority."""
    sampling = SamplingParams(
        temperature=temperature, seed=seed, max_tokens=max_tokens,
        stop_token_ids=stop_token_ids, ignore_eos=ignore_eos,
    )
    return GenerationRequest(prompt_ids, GenerationParams(sampling, n, stop), scope=scope,
                             priority=priority)


@dataclass
class Result:
    """One request's accumulated output."""

    token_ids: dict[int, list[int]] = field(default_factory=dict)
    text: dict[int, str] = field(default_factory=dict)
    finish_reason: dict[int, str | None] = field(default_factory=dict)
    usage: Usage | None = None


def run(
    engine: Engine,
    requests: dict[int, GenerationRequest],
    results: dict[int, Result] | None = None,
    max_steps: int = 10_000,
) -> dict[int, Result]:
    """Add ``requests`` and step until every request (also ones added before) finishes,
    checking the KV invariants after each step; results by request id (folded into
    ``results`` when given)."""
    results = {} if results is None else results
    for request_id, req in requests.items():
        engine.add_request(request_id, req)
    for _ in range(max_steps):
        if not engine.has_work():
            break
        collect(engine.step(), results)
        engine.manager.check_invariants()
    assert not engine.has_work(), "requests did not finish"
    assert engine.manager.stats().num_used_blocks == 0, "blocks leaked"
    return results


def collect(outputs: dict, results: dict[int, Result]) -> None:
    """Fold one step's outputs into ``results``."""
    for request_id, output in outputs.items():
        result = results.setdefault(request_id, Result())
        for delta in output.deltas:
            result.token_ids.setdefault(delta.index, []).extend(delta.token_ids)
            result.text[delta.index] = result.text.get(delta.index, "") + delta.text
            result.finish_reason[delta.index] = delta.finish_reason
        if output.usage is not None:
            result.usage = output.usage


def run_async(test: Callable[[AsyncEngine], Awaitable[None]], max_in_flight: int = 8) -> None:
    """Run ``test(bridge)`` on a fresh loop with a started engine thread."""
    engine = make_engine()
    bridge = AsyncEngine(engine, KVEventFeed(engine.manager), max_in_flight)

    async def main() -> None:
        bridge.start(asyncio.get_running_loop())
        try:
            await test(bridge)
        finally:
            bridge.stop()

    asyncio.run(main())


def used_blocks(engine: Engine) -> int:
    """The engine's KV blocks in use, after checking the manager's invariants."""
    engine.manager.check_invariants()
    return engine.manager.stats().num_used_blocks
