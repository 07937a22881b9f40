"""The grouped LoRA delta on a CUDA GPU: correctness, then speed beside the base matmul.

A section of ``bench.gpu_attention``'s one-call script. It checks the Triton delta
(``workers.lora.sgmv``) against the torch reference on a decode batch, a prefill
batch and a ragged batch (odd feature sizes, ranks below the padded maximum, base
rows between runs, a slot used by two runs), then times each batch's delta against
the reference and against the base projection ``x·Wᵀ`` it is added to.

Batches: ``--lora-decode-rows`` decode rows over ``--lora-adapters`` adapters, once
sorted by adapter (one run per adapter) and once interleaved (one run per row, the
worst case); a ``--lora-prefill-tokens`` prefill cut into one run per adapter.
"""

from __future__ import annotations

import argparse
from functools import partial
from typing import Any

import torch

from bench.gpu_timing import max_error, median_ms
from workers.lora.reference import lora_delta_reference
from workers.lora.segments import segments_from_rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The LoRA section's options (sizes of the adapters and batches)."""
    parser.add_argument("--lora-hidden", type=int, default=4096, help="in and out features")
    parser.add_argument("--lora-rank", type=int, default=16, help="max LoRA rank of the slots")
    parser.add_argument("--lora-adapters", type=int, default=4)
    parser.add_argument("--lora-decode-rows", type=int, default=16)
    parser.add_argument("--lora-prefill-tokens", type=int, default=2048)


class _Batch:
    """Random slot weights (``--lora-adapters`` slots at ``--lora-rank``; slot ``s``
    holds an adapter of rank ``rank >> s``, zero-padded) and one batch's rows."""

    def __init__(self, args: argparse.Namespace, dtype: torch.dtype, row_counts: list[int],
                 row_slots: list[int | None], in_features: int, out_features: int) -> None:
        device, rank, slots = args.device, args.lora_rank, args.lora_adapters
        self.x = torch.randn(sum(row_counts), in_features, device=device, dtype=dtype)
        self.segments = segments_from_rows(row_counts, row_slots, device)
        lora_a = torch.randn(slots, rank, in_features, device=device) / in_features**0.5
        lora_b = torch.randn(slots, out_features, rank, device=device) / rank**0.5
        for slot in range(slots):
            lora_a[slot, max(1, rank >> slot) :] = 0
            lora_b[slot, :, max(1, rank >> slot) :] = 0
        self.lora_a, self.lora_b = lora_a.to(dtype), lora_b.to(dtype)
        self.scales = torch.rand(slots, device=device) * 2
        self.base_weight = torch.randn(out_features, in_features, device=device, dtype=dtype)

    def args(self) -> tuple:
        return self.x, self.segments, self.lora_a, self.lora_b, self.scales


def _batches(args: argparse.Namespace, dtype: torch.dtype) -> dict[str, _Batch]:
    adapters, rows, hidden = args.lora_adapters, args.lora_decode_rows, args.lora_hidden
    per_run = -(-args.lora_prefill_tokens // adapters)
    return {
        "decode_sorted": _Batch(args, dtype, [1] * rows,
                                sorted(i % adapters for i in range(rows)), hidden, hidden),
        "decode_interleaved": _Batch(args, dtype, [1] * rows,
                                     [i % adapters for i in range(rows)], hidden, hidden),
        "prefill": _Batch(args, dtype, [per_run] * adapters, list(range(adapters)), hidden, hidden),
    }


def check(args: argparse.Namespace, dtype: torch.dtype, tolerance: float) -> dict[str, float]:
    """Max ``|triton - reference|`` over max ``|reference|`` per batch; exits non-zero
    past ``tolerance``."""
    from workers.lora.sgmv import lora_delta_triton

    hidden = args.lora_hidden
    ragged = _Batch(args, dtype, [3, 2, 40, 1, 5], [0, None, args.lora_adapters - 1, None, 0],
                    hidden * 3 // 4 + 3, hidden + 5)
    errors = {}
    for name, batch in {**_batches(args, dtype), "ragged": ragged}.items():
        expected = lora_delta_reference(*batch.args())
        scale = max(expected.float().abs().max().item(), 1e-6)
        errors[name] = max_error(lora_delta_triton(*batch.args()), expected) / scale
    bad = {name: e for name, e in errors.items() if not e <= tolerance}
    if bad:
        raise SystemExit(f"Triton LoRA delta differs from the reference beyond {tolerance}: {bad}")
    return errors


def timings(args: argparse.Namespace, dtype: torch.dtype) -> list[dict[str, Any]]:
    """Per batch: the Triton delta, the torch reference and the base projection (ms)."""
    from workers.lora.sgmv import lora_delta_triton

    rows = []
    for name, batch in _batches(args, dtype).items():
        times = {
            "triton_ms": median_ms(partial(lora_delta_triton, *batch.args()), args.iters),
            "reference_ms": median_ms(partial(lora_delta_reference, *batch.args()), args.iters),
            "base_matmul_ms": median_ms(
                partial(torch.mm, batch.x, batch.base_weight.T), args.iters
            ),
        }
        rows.append({"batch": name, "rows": batch.x.shape[0],
                     "runs": batch.segments.num_segments, **times,
                     "triton_over_base": round(times["triton_ms"] / times["base_matmul_ms"], 3)})
    return rows


def print_results(results: dict[str, Any]) -> None:
    """The LoRA section of the script's table (``lora_correctness`` and ``lora``)."""
    print("\nLoRA delta, max |triton - reference| / max |reference|:",
          {k: f"{v:.2e}" for k, v in results["lora_correctness"].items()})
    print(f"{'lora batch':>20} {'rows':>6} {'runs':>5} {'triton ms':>10} {'ref ms':>9} "
          f"{'base mm ms':>11} {'triton/base':>12}")
    for row in results["lora"]:
        print(f"{row['batch']:>20} {row['rows']:>6} {row['runs']:>5} {row['triton_ms']:>10.3f} "
              f"{row['reference_ms']:>9.3f} {row['base_matmul_ms']:>11.3f} "
              f"{row['triton_over_base']:>12.3f}")
