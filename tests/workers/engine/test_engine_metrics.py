"""The engine's token counters, length and TTFT histograms, and tail-block fill."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from tests.workers.engine.engine_support import BLOCK_SIZE, make_engine, prompt, request, run
from workers.engine.metrics import TailBlockFill


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    assert value is not None, f"{name}{labels} not exported"
    return value


def test_token_counters_and_length_histograms_count_each_request_once() -> None:
    registry = CollectorRegistry()
    engine = make_engine(registry=registry)
    run(engine, {1: request(prompt(40), max_tokens=8), 2: request(prompt(20, 1), max_tokens=5, n=2),
                 3: request(prompt(600, 2), max_tokens=1)})
    stats = engine.stats()
    assert stats.prompt_tokens_total == 40 + 20 + 600, "a forked prompt is counted once"
    assert stats.generation_tokens_total == 8 + 2 * 5 + 1
    assert sample(registry, "request_prompt_tokens_count") == 3
    assert sample(registry, "request_prompt_tokens_sum") == 660
    assert sample(registry, "request_generation_tokens_sum") == 19
    assert sample(registry, "request_generation_tokens_bucket", le="5.0") == 1
    assert sample(registry, "request_generation_tokens_bucket", le="10.0") == 3


def test_ttft_and_tpot_are_labelled_by_prompt_length_bucket() -> None:
    registry = CollectorRegistry()
    engine = make_engine(registry=registry)
    run(engine, {1: request(prompt(128), max_tokens=2), 2: request(prompt(129, 1), max_tokens=3),
                 3: request(prompt(30, 2), max_tokens=2, n=3)})

    def counts(name: str) -> dict[str, float]:
        return {bucket: sample(registry, f"{name}_count", prompt_len_bucket=bucket)
                for bucket in ("128", "512", "2048", "8192", "32768", "+Inf")}

    zeros = {"2048": 0, "8192": 0, "32768": 0, "+Inf": 0}
    assert counts("time_to_first_token_seconds") == {"128": 1 + 3, "512": 1, **zeros}
    # Intervals: one per token after a choice's first.
    assert counts("time_per_output_token_seconds") == {"128": 1 + 3, "512": 2, **zeros}


def test_tail_block_fill_of_running_sequences() -> None:
    engine = make_engine(max_batched_tokens=512)
    idle = engine.stats()
    assert (idle.kv_tail_block_fill_ratio, idle.num_kv_tail_empty_slots) == (1.0, 0)
    engine.add_request(1, request(prompt(40), max_tokens=8))
    engine.add_request(2, request(prompt(BLOCK_SIZE, 1), max_tokens=8))
    engine.step()  # both prefilled, one token sampled each
    stats = engine.stats()
    # 41 tokens in 3 blocks: 7 empty slots; 17 tokens, the 17th without a block yet: 0.
    assert stats.num_kv_tail_empty_slots == 7
    assert stats.kv_tail_block_fill_ratio == 1 - 7 / (2 * BLOCK_SIZE)


def test_tail_block_fill_measure() -> None:
    assert TailBlockFill.measure([], 16) == TailBlockFill(1.0, 0)
    assert TailBlockFill.measure([(1, 1), (16, 1), (33, 3)], 16) == TailBlockFill(
        1 - (15 + 0 + 15) / 48, 30)
