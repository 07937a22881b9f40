"""Model micro-benchmark on the CPU with the demo checkpoint.

Prefill: a 2,000-token prompt with 0%, 50% and 95% of it already in the paged
cache (the cached part is prefilled untimed first); the timed step computes only
the rest. Decode: greedy tokens/s at batch 1 and 16 after a 128-token prompt,
through ``ModelRunner`` + ``sample``, against transformers ``generate`` on the same
weights in the same run. transformers' decode rate excludes its prefill: it is
``(t(1 + N tokens) - t(1 token)) / N`` per sequence step.

Run: ``python -m bench.model_bench [--prompt-tokens N] [--decode-steps N] [--threads N]``.
On a busy machine prefer ``--threads 1``: OpenMP threads that wait for a descheduled
sibling at every op make many-small-op workloads (both columns) erratic.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from workers.model.demo import ensure_demo_checkpoint
from workers.model.loader import LoadedModel, load_model
from workers.model.runner import ModelRunner
from workers.model.sampler import SamplingParams, sample
from workers.model.step_input import StepInput

BLOCK_SIZE = 16
CACHED_FRACTIONS = (0.0, 0.5, 0.95)
DECODE_BATCHES = (1, 16)
DECODE_PROMPT_TOKENS = 128
GREEDY = SamplingParams(temperature=0)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print its table, return the numbers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=2000)
    parser.add_argument("--decode-steps", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    loaded = load_model(ensure_demo_checkpoint())
    results: dict[str, Any] = {"threads": torch.get_num_threads(), "prefill": {}, "decode": {}}
    for fraction in CACHED_FRACTIONS:
        seconds = _prefill_seconds(loaded, args.prompt_tokens, fraction, args.repeats)
        results["prefill"][f"{fraction:.0%}"] = {
            "cached_tokens": int(args.prompt_tokens * fraction),
            "ms": round(seconds * 1e3, 2),
        }
    hf_model = _transformers_model(loaded)
    for batch in DECODE_BATCHES:
        ours = _decode_tokens_per_s(loaded, batch, args.decode_steps)
        theirs = _hf_decode_tokens_per_s(hf_model, batch, args.decode_steps) if hf_model else None
        results["decode"][f"batch{batch}"] = {
            "tokens_per_s": round(ours, 1),
            "transformers_tokens_per_s": None if theirs is None else round(theirs, 1),
            "ratio": None if theirs is None else round(ours / theirs, 2),
        }
    _print_table(results, args.prompt_tokens)
    return results


def _prefill_seconds(loaded: LoadedModel, num_tokens: int, fraction: float, repeats: int) -> float:
    num_cached = int(num_tokens * fraction)
    prompt = _prompt(num_tokens, seed=1)
    num_blocks = -(-num_tokens // BLOCK_SIZE)
    runner = _runner(loaded, num_blocks)
    table = list(range(num_blocks))
    if num_cached:
        runner.execute([StepInput(prompt[:num_cached], 0, table)])
    step = [StepInput(prompt[num_cached:], num_cached, table)]
    return _median_seconds(lambda: runner.execute(step), repeats)


def _decode_tokens_per_s(loaded: LoadedModel, batch: int, steps: int) -> float:
    blocks_per_seq = -(-(DECODE_PROMPT_TOKENS + steps + 1) // BLOCK_SIZE)
    runner = _runner(loaded, batch * blocks_per_seq)
    tables = [list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(batch)]
    sequences = [_prompt(DECODE_PROMPT_TOKENS, seed=10 + i) for i in range(batch)]
    logits = runner.execute([StepInput(s, 0, t) for s, t in zip(sequences, tables, strict=True)])
    start = time.perf_counter()
    for _ in range(steps):
        for seq, token in zip(
            sequences, sample(logits, [GREEDY] * batch, [None] * batch), strict=True
        ):
            seq.append(token)
        logits = runner.execute(
            [StepInput(s[-1:], len(s) - 1, t) for s, t in zip(sequences, tables, strict=True)]
        )
    return batch * steps / (time.perf_counter() - start)


def _hf_decode_tokens_per_s(hf_model: torch.nn.Module, batch: int, steps: int) -> float:
    prompts = torch.tensor([_prompt(DECODE_PROMPT_TOKENS, seed=10 + i) for i in range(batch)])

    def generate(num_tokens: int) -> float:
        start = time.perf_counter()
        with torch.inference_mode():
            hf_model.generate(prompts, max_new_tokens=num_tokens, do_sample=False)
        return time.perf_counter() - start

    generate(2)  # warm-up
    return batch * steps / (generate(steps + 1) - generate(1))


def _transformers_model(loaded: LoadedModel) -> torch.nn.Module | None:
    try:
        import transformers
    except ImportError:
        print("transformers is not installed: no comparison column")
        return None
    model = transformers.LlamaForCausalLM.from_pretrained(loaded.path).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _runner(loaded: LoadedModel, num_blocks: int) -> ModelRunner:
    config = loaded.config
    shape = (num_blocks, BLOCK_SIZE, config.num_key_value_heads, config.head_dim)
    layers = range(config.num_hidden_layers)
    return ModelRunner(
        loaded.model,
        [torch.zeros(shape) for _ in layers],
        [torch.zeros(shape) for _ in layers],
        BLOCK_SIZE,
    )


def _prompt(num_tokens: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(num_tokens)]


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _print_table(results: dict[str, Any], prompt_tokens: int) -> None:
    print(f"demo model on CPU, {results['threads']} threads, block size {BLOCK_SIZE}")
    print(f"\nprefill of a {prompt_tokens}-token prompt")
    print(f"{'cached':>8} {'cached tokens':>14} {'ms':>10}")
    for label, row in results["prefill"].items():
        print(f"{label:>8} {row['cached_tokens']:>14} {row['ms']:>10.1f}")
    print(f"\ngreedy decode after a {DECODE_PROMPT_TOKENS}-token prompt (tokens/s)")
    print(f"{'batch':>8} {'ours':>10} {'transformers':>14} {'ratio':>8}")
    for label, row in results["decode"].items():
        theirs = row["transformers_tokens_per_s"]
        ratio = row["ratio"]
        print(
            f"{label.removeprefix('batch'):>8} {row['tokens_per_s']:>10.1f} "
            f"{'-' if theirs is None else f'{theirs:.1f}':>14} {'-' if ratio is None else f'{ratio:.2f}x':>8}"
        )


if __name__ == "__main__":
    main()
