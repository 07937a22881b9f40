"""LoRA decode cost on the CPU: a batch of 16 sequences decoding, 4 adapters of 4 rows
each (rank ``--rank``, every projection targeted) against the same batch on the base
model, through ``ModelRunner`` with the demo checkpoint (or ``--model DIR``).

Base and LoRA steps alternate, so machine load hits both alike; the figure is the
median time per decode step of each and their ratio (issue 25's target: at most 1.3).

Run: ``python -m bench lora_decode [--steps N] [--rank R] [--threads N]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from harness.lora_adapters import model_shapes, write_peft_adapter
from workers.lora.peft_files import read_adapter
from workers.lora.weights import LoraWeights
from workers.model.demo import ensure_demo_checkpoint
from workers.model.loader import load_model
from workers.model.runner import ModelRunner
from workers.model.step_input import StepInput

BLOCK_SIZE = 16
BATCH = 16
NUM_ADAPTERS = 4
PROMPT_TOKENS = 128


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark, print its line, return the numbers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="HF directory (default demo)")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model_dir = args.model or ensure_demo_checkpoint()
    loaded = load_model(model_dir)
    blocks_per_seq = -(-(PROMPT_TOKENS + 2 * args.steps + 2) // BLOCK_SIZE)
    num_blocks = BATCH * blocks_per_seq
    shape = (num_blocks, BLOCK_SIZE, loaded.config.num_key_value_heads, loaded.config.head_dim)
    dtype = loaded.model.lm_head.weight.dtype
    caches = [[torch.zeros(shape, dtype=dtype) for _ in range(loaded.config.num_hidden_layers)]
              for _ in range(2)]
    weights = _adapter_slots(model_dir, args.rank, dtype)
    runner = ModelRunner(loaded.model, caches[0], caches[1], BLOCK_SIZE, lora=weights)
    tables = [list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq)) for i in range(BATCH)]
    slots = [i * NUM_ADAPTERS // BATCH for i in range(BATCH)]
    lengths = [PROMPT_TOKENS] * BATCH
    runner.execute([StepInput([7] * PROMPT_TOKENS, 0, t) for t in tables])
    base_s, lora_s = [], []
    for _ in range(args.steps):
        for with_lora, times in ((False, base_s), (True, lora_s)):
            step = [StepInput([11], n, t, slot if with_lora else None)
                    for n, t, slot in zip(lengths, tables, slots, strict=True)]
            start = time.perf_counter()
            runner.execute(step)
            times.append(time.perf_counter() - start)
            lengths = [n + 1 for n in lengths]
    base_ms, lora_ms = (1e3 * statistics.median(t) for t in (base_s, lora_s))
    results = {"model": str(model_dir), "batch": BATCH, "adapters": NUM_ADAPTERS,
               "rank": args.rank, "threads": args.threads, "steps": args.steps,
               "base_ms_per_step": round(base_ms, 3), "lora_ms_per_step": round(lora_ms, 3),
               "ratio": round(lora_ms / base_ms, 3)}
    print(f"decode batch {BATCH}, {NUM_ADAPTERS} adapters of rank {args.rank}: base "
          f"{base_ms:.2f} ms/step, LoRA {lora_ms:.2f} ms/step, ratio {lora_ms / base_ms:.2f}")
    return results


def _adapter_slots(model_dir: Path, rank: int, dtype: torch.dtype) -> LoraWeights:
    """``NUM_ADAPTERS`` random adapters of ``rank`` loaded into slots 0..3."""
    shapes = model_shapes(model_dir)
    weights = LoraWeights(shapes, NUM_ADAPTERS, rank, dtype, "cpu")
    with tempfile.TemporaryDirectory() as tmp:
        for slot in range(NUM_ADAPTERS):
            path = write_peft_adapter(Path(tmp) / f"a{slot}", model_dir, rank, 2 * rank, slot)
            weights.load(slot, read_adapter(f"a{slot}", path, shapes, rank))
    return weights


if __name__ == "__main__":
    main()
