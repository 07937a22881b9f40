"""KV capacity planning: how many blocks a byte budget buys.

``python -m workers.kv.plan --layers 32 --kv-heads 8 --head-dim 128 --dtype bf16
--kv-cache-bytes 16GiB [--seq-len 4096] [--block-size 16]`` prints the plan for the
chosen dtype and, for comparison, for fp16, bf16 and fp8.

Safety margin: the planner keeps back ``safety_margin`` (default 2%) of the budget.
It absorbs allocator rounding and the temporaries of a batched block copy
(``KVCacheTensors.copy_blocks`` gathers the source blocks before scattering them:
64 copy-on-write copies of a 7B-shape block are 128 MiB), so a budget that was
measured as free memory does not run out when the cache is in use.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from radix.config_flags import parse_bytes
from workers.kv.spec import KVCacheSpec

DEFAULT_SAFETY_MARGIN = 0.02


@dataclass(frozen=True)
class KVCachePlan:
    """The blocks that fit ``kv_cache_bytes`` after the safety margin, whole blocks only."""

    spec: KVCacheSpec
    kv_cache_bytes: int
    safety_margin: float
    num_blocks: int
    sizing_rule: str = "kv_cache_bytes"

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V for one token across all layers."""
        return self.spec.kv_bytes_per_token

    @property
    def num_tokens(self) -> int:
        """Token capacity after the margin (``num_blocks x block_size``)."""
        return self.num_blocks * self.spec.block_size

    @property
    def num_tokens_before_margin(self) -> int:
        """Token capacity of the whole budget, ignoring the margin."""
        return self.kv_cache_bytes // self.spec.kv_bytes_per_token

    @property
    def kv_cache_bytes_used(self) -> int:
        """Bytes the preallocated blocks take."""
        return self.num_blocks * self.spec.kv_bytes_per_block

    def num_sequences(self, seq_len: int) -> int:
        """How many sequences of ``seq_len`` tokens fit at once (each needs whole blocks)."""
        if seq_len <= 0:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        return self.num_blocks // math.ceil(seq_len / self.spec.block_size)


def gpu_kv_budget(total_bytes: int, fraction: float, weights_bytes: int,
                  peak_activation_bytes: int) -> int:
    """vLLM's ``gpu_memory_utilization``: the KV budget is ``fraction`` of the GPU's
    ``total_bytes`` less what the model holds (``weights_bytes``) and the peak
    activation of its largest forward. ValueError (naming the numbers) when nothing
    is left or an input is out of range."""
    if not 0 < fraction <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {fraction}")
    if min(total_bytes, weights_bytes, peak_activation_bytes) < 0:
        raise ValueError("memory sizes must not be negative")
    budget = int(total_bytes * fraction) - weights_bytes - peak_activation_bytes
    if budget <= 0:
        raise ValueError(
            f"gpu_memory_utilization {fraction} of {format_bytes(total_bytes)} leaves no KV "
            f"memory after {format_bytes(weights_bytes)} of weights and "
            f"{format_bytes(peak_activation_bytes)} of peak activation")
    return budget


def plan_kv_cache(
    spec: KVCacheSpec, kv_cache_bytes: int, safety_margin: float = DEFAULT_SAFETY_MARGIN,
    sizing_rule: str = "kv_cache_bytes",
) -> KVCachePlan:
    """Plan the cache for a byte budget (``gpu_kv_budget`` sizes one from GPU memory);
    ``sizing_rule`` says how the budget was chosen. Raises ValueError if not even one
    block fits."""
    if kv_cache_bytes <= 0:
        raise ValueError(f"kv_cache_bytes must be positive, got {kv_cache_bytes}")
    if not 0 <= safety_margin < 1:
        raise ValueError(f"safety_margin must be in [0, 1), got {safety_margin}")
    usable = int(kv_cache_bytes * (1 - safety_margin))
    num_blocks = usable // spec.kv_bytes_per_block
    if num_blocks == 0:
        raise ValueError(
            f"kv_cache_bytes={kv_cache_bytes} holds no block of {spec.kv_bytes_per_block} bytes"
        )
    return KVCachePlan(spec, kv_cache_bytes, safety_margin, num_blocks, sizing_rule)


def format_bytes(num_bytes: int) -> str:
    """Binary units, e.g. ``128.0 KiB``."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= size:
            return f"{num_bytes / size:.1f} {unit}"
    return f"{num_bytes} B"


def describe(plan: KVCachePlan, seq_len: int | None) -> str:
    """Human-readable lines for one plan."""
    spec = plan.spec
    lines = [
        f"dtype {spec.dtype}: {plan.kv_bytes_per_token:,} B/token "
        f"({format_bytes(plan.kv_bytes_per_token)}), block of {spec.block_size} tokens "
        f"= {format_bytes(spec.kv_bytes_per_block)}",
        f"  budget {format_bytes(plan.kv_cache_bytes)} ({plan.sizing_rule}): "
        f"{plan.num_tokens_before_margin:,} tokens "
        f"before the {plan.safety_margin:.0%} margin",
        f"  {plan.num_blocks:,} blocks = {plan.num_tokens:,} tokens "
        f"({format_bytes(plan.kv_cache_bytes_used)} allocated)",
    ]
    if seq_len is not None:
        lines.append(f"  sequences of {seq_len:,} tokens at once: {plan.num_sequences(seq_len):,}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, KVCachePlan]:
    """CLI entry point; prints the plans and returns them by dtype."""
    parser = argparse.ArgumentParser(description="Plan a paged KV cache for a byte budget.")
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--kv-heads", type=int, required=True)
    parser.add_argument("--head-dim", type=int, required=True)
    parser.add_argument("--dtype", default="bf16", help="fp16, bf16, fp8 (float8_e4m3fn), fp32")
    parser.add_argument("--kv-cache-bytes", type=parse_bytes, required=True, help="e.g. 16GiB")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--safety-margin", type=float, default=DEFAULT_SAFETY_MARGIN)
    args = parser.parse_args(argv)
    plans: dict[str, KVCachePlan] = {}
    chosen = KVCacheSpec(args.layers, args.kv_heads, args.head_dim, args.dtype, args.block_size)
    for dtype in dict.fromkeys([chosen.dtype, "float16", "bfloat16", "float8_e4m3fn"]):
        spec = KVCacheSpec(args.layers, args.kv_heads, args.head_dim, dtype, args.block_size)
        plans[dtype] = plan_kv_cache(spec, args.kv_cache_bytes, args.safety_margin)
    print(describe(plans[chosen.dtype], args.seq_len))
    print("\ncomparison:")
    header = f"{'dtype':<14}{'B/token':>10}{'blocks':>10}{'tokens':>12}"
    print(header + (f"{'seqs@' + str(args.seq_len):>12}" if args.seq_len else ""))
    for dtype, plan in plans.items():
        row = (
            f"{dtype:<14}{plan.kv_bytes_per_token:>10,}{plan.num_blocks:>10,}{plan.num_tokens:>12,}"
        )
        print(row + (f"{plan.num_sequences(args.seq_len):>12,}" if args.seq_len else ""))
    return plans


if __name__ == "__main__":
    main()
