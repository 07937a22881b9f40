"""Paged-attention and LoRA kernels on a CUDA GPU: correctness, then speed against torch.

One run (well under 3 minutes on an H200) does four things:

1. checks the Triton kernels against the torch reference on ragged batches with
   scrambled block tables, in the chosen dtype (fails loudly past tolerance);
2. times paged decode at several batch sizes against SDPA over K/V that is already
   gathered into contiguous tensors (torch's best case: no paging cost) and against
   the reference (gather + SDPA), and reports achieved K/V read bandwidth;
3. times paged prefill of new tokens over a cached prefix, and the K/V store;
4. checks the grouped LoRA delta against its reference, then times it beside the
   base projection it is added to (``bench.gpu_lora``, options ``--lora-*``);
5. checks a demo worker sized by ``--gpu-memory-utilization`` stays within it
   (``bench.gpu_sizing``; CUDA only).

``--kv-dtype fp8_e4m3`` (or ``fp8_e5m2``) runs all three with an FP8 cache: K/V
quantized with a per-layer scale, queries and outputs in ``--dtype``; the SDPA
baseline reads K/V gathered and dequantized to ``--dtype`` beforehand.

Run: ``python -m bench.gpu_attention [--dtype bfloat16] [--kv-dtype auto|fp8_e4m3|fp8_e5m2]
[--context 4096] [--json PATH]``.
``--device cpu`` with ``TRITON_INTERPRET=1`` and tiny shapes is a smoke run of this
script's logic on a machine without a GPU (its timings mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from bench import gpu_lora, gpu_sizing
from bench.gpu_timing import max_error, median_ms
from workers.attention import reference
from workers.attention.metadata import AttentionMetadata
from workers.config import LoraSettings

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
TOLERANCE = {torch.bfloat16: 3e-2, torch.float16: 3e-3, torch.float32: 2e-4}
KV_DTYPES = {"auto": None, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
FP8_SCALE = 1 / 64  # randn values / scale stay inside both FP8 ranges


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options (shape of the attention problem, repetitions, output)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument("--kv-dtype", choices=sorted(KV_DTYPES), default="auto",
                        help="KV cache dtype (auto: --dtype)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--context", type=int, default=4096, help="decode context length")
    parser.add_argument("--decode-batches", default="1,16,64,256")
    parser.add_argument("--prefill-batch", type=int, default=4)
    parser.add_argument("--prefill-new", type=int, default=512, help="new tokens per sequence")
    parser.add_argument("--prefill-cached", type=int, default=3584, help="cached prefix tokens")
    parser.add_argument("--store-tokens", type=int, default=8192)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5,
                        help="fraction for the KV sizing check (bench.gpu_sizing)")
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    gpu_lora.add_arguments(parser)
    args = parser.parse_args(argv)
    args.decode_batches = [int(b) for b in args.decode_batches.split(",") if b]
    if args.heads % args.kv_heads or args.block_size < 1 or not args.decode_batches:
        parser.error("need heads % kv-heads == 0, block-size >= 1 and at least one batch")
    lora_sizes = (args.lora_hidden, args.lora_rank, args.lora_adapters, args.lora_decode_rows,
                  args.lora_prefill_tokens)
    if min(lora_sizes) < 1:
        parser.error("the --lora-* sizes must be >= 1")
    if args.device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        parser.error("--device cpu is a smoke run: set TRITON_INTERPRET=1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the checks and timings; print a table; return (and optionally save) the numbers."""
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench.gpu_attention needs a CUDA device (none found)")
    from workers.attention import triton_kernels

    torch.manual_seed(0)
    dtype = DTYPES[args.dtype]
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu (interpreter)",
        "shape": {
            k: getattr(args, k)
            for k in ("dtype", "kv_dtype", "block_size", "heads", "kv_heads", "head_dim")
        },
        "correctness": _check_correctness(triton_kernels, args, dtype),
        "lora_correctness": gpu_lora.check(args, dtype, TOLERANCE[dtype]),
        "decode": [_time_decode(triton_kernels, args, dtype, b) for b in args.decode_batches],
        "prefill": _time_prefill(triton_kernels, args, dtype),
        "store_kv": _time_store(triton_kernels, args, dtype),
        "lora": gpu_lora.timings(args, dtype),
    }
    if args.device == "cuda":
        results["kv_sizing"] = gpu_sizing.check_sizing(args.gpu_memory_utilization)
        results["kv_sizing_lora"] = gpu_sizing.check_sizing(
            args.gpu_memory_utilization, lora=LoraSettings(enable=True, max_loras=8, max_lora_rank=64))
    _print(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return results


class _Problem:
    """Random caches and a batch layout; sequences get scrambled, disjoint block tables."""

    def __init__(self, args: argparse.Namespace, dtype: torch.dtype, query_lens: list[int],
                 computed: list[int]) -> None:
        bs = args.block_size
        blocks_per_seq = [-(-(c + q) // bs) for c, q in zip(computed, query_lens, strict=True)]
        num_blocks = sum(blocks_per_seq)
        order = torch.randperm(num_blocks).tolist()
        tables, start = [], 0
        for n in blocks_per_seq:
            tables.append(order[start : start + n])
            start += n
        shape = (num_blocks, bs, args.kv_heads, args.head_dim)
        kv_dtype = KV_DTYPES[args.kv_dtype]
        channels = torch.full(shape[2:], FP8_SCALE, device=args.device)
        # Per-channel scales and K offsets (zero here), as a calibrated FP8 cache has them.
        self.store_scales = (None, None, None) if kv_dtype is None else (
            channels, torch.zeros_like(channels), channels)
        self.read_scales = self.store_scales[::2]
        self.key_cache, self.value_cache = (
            reference.quantize(torch.randn(shape, device=args.device, dtype=dtype),
                               kv_dtype or dtype, self.store_scales[0], self.store_scales[1])
            for _ in range(2)
        )
        self.metadata = AttentionMetadata.build(
            query_lens, computed, tables, bs, num_blocks, args.device
        )
        self.query = torch.randn(
            sum(query_lens), args.heads, args.head_dim, device=args.device, dtype=dtype
        )
        self.scale = args.head_dim**-0.5

    def decode_args(self) -> tuple:
        m = self.metadata
        return (
            self.query,
            self.key_cache,
            self.value_cache,
            m.seq_lens,
            m.block_tables,
            self.scale,
            *self.read_scales,
        )

    def prefill_args(self) -> tuple:
        m = self.metadata
        return (self.query, self.key_cache, self.value_cache, m.query_start_loc, m.seq_lens,
                m.block_tables, m.max_query_len, self.scale, *self.read_scales)


def _check_correctness(
    kernels: Any, args: argparse.Namespace, dtype: torch.dtype
) -> dict[str, float]:
    ctx = args.context
    decode = _Problem(args, dtype, [1] * 7, [0, 15, 16, 17, ctx // 4, ctx // 2 - 1, ctx - 1])
    prefill = _Problem(args, dtype, [1, 37, ctx // 8, 128], [0, ctx // 4, 16, ctx // 2])
    store_keys = torch.randn(64, args.kv_heads, args.head_dim, device=args.device, dtype=dtype)
    slots = torch.randperm(prefill.key_cache.shape[0] * args.block_size, device=args.device)[:64]
    expected = [c.clone() for c in (prefill.key_cache, prefill.value_cache)]
    scales = prefill.store_scales
    reference.write_kv(*expected, store_keys, -store_keys, slots, *scales)
    kernels.store_kv(prefill.key_cache, prefill.value_cache, store_keys, -store_keys, slots,
                     *scales)
    errors = {
        "store_kv": max(max_error(a, b) for a, b in
                        zip(expected, (prefill.key_cache, prefill.value_cache), strict=True)),
        "decode": max_error(kernels.paged_decode(*decode.decode_args()),
                             reference.paged_decode(*decode.decode_args())),
        "decode_4_splits": max_error(kernels.paged_decode(*decode.decode_args(), num_splits=4),
                                      reference.paged_decode(*decode.decode_args())),
        "prefill": max_error(kernels.paged_prefill(*prefill.prefill_args()),
                              reference.paged_prefill(*prefill.prefill_args())),
    }
    bad = {name: e for name, e in errors.items() if not e <= TOLERANCE[dtype]}
    if bad:
        raise SystemExit(f"Triton differs from the reference beyond {TOLERANCE[dtype]}: {bad}")
    return errors


def _time_decode(
    kernels: Any, args: argparse.Namespace, dtype: torch.dtype, batch: int
) -> dict[str, Any]:
    problem = _Problem(args, dtype, [1] * batch, [args.context - 1] * batch)
    query = problem.query[:, :, None]  # [B, H, 1, D]
    keys, values = _contiguous_kv(problem, batch, args.context)
    times = {
        "triton_ms": median_ms(lambda: kernels.paged_decode(*problem.decode_args()), args.iters),
        "sdpa_contiguous_ms": median_ms(
            lambda: F.scaled_dot_product_attention(query, keys, values, scale=problem.scale,
                                                   enable_gqa=True),
            args.iters,
        ),
        "reference_ms": median_ms(lambda: reference.paged_decode(*problem.decode_args()), args.iters),
    }
    kv_bytes = (
        2 * batch * args.context * args.kv_heads * args.head_dim * problem.key_cache.element_size()
    )
    return {"batch": batch, "context": args.context, **times,
            "triton_kv_GBps": round(kv_bytes / times["triton_ms"] / 1e6, 1),
            "sdpa_kv_GBps": round(kv_bytes / times["sdpa_contiguous_ms"] / 1e6, 1)}


def _time_prefill(kernels: Any, args: argparse.Namespace, dtype: torch.dtype) -> dict[str, Any]:
    batch, new, cached = args.prefill_batch, args.prefill_new, args.prefill_cached
    problem = _Problem(args, dtype, [new] * batch, [cached] * batch)
    total = new + cached
    query = problem.query.view(batch, new, args.heads, args.head_dim).transpose(1, 2)
    keys, values = _contiguous_kv(problem, batch, total)
    positions = torch.arange(total, device=args.device)
    mask = positions[None, :] <= (cached + torch.arange(new, device=args.device))[:, None]
    times = {
        "triton_ms": median_ms(lambda: kernels.paged_prefill(*problem.prefill_args()), args.iters),
        "sdpa_contiguous_ms": median_ms(
            lambda: F.scaled_dot_product_attention(query, keys, values, attn_mask=mask,
                                                   scale=problem.scale, enable_gqa=True),
            args.iters,
        ),
    }
    # Useful FLOPs: QK^T and PV over the visible (prefix + causal) keys only.
    visible = batch * args.heads * (new * cached + new * (new + 1) / 2)
    flops = 4 * visible * args.head_dim
    return {"batch": batch, "new_tokens": new, "cached_tokens": cached, **times,
            "triton_TFLOPs": round(flops / times["triton_ms"] / 1e9, 1),
            "sdpa_TFLOPs": round(flops / times["sdpa_contiguous_ms"] / 1e9, 1)}


def _time_store(kernels: Any, args: argparse.Namespace, dtype: torch.dtype) -> dict[str, Any]:
    tokens = args.store_tokens
    problem = _Problem(args, dtype, [tokens], [0])
    keys = torch.randn(tokens, args.kv_heads, args.head_dim, device=args.device, dtype=dtype)
    slots = problem.metadata.slot_mapping
    caches = (problem.key_cache, problem.value_cache)
    scales = problem.store_scales
    triton_ms = median_ms(lambda: kernels.store_kv(*caches, keys, keys, slots, *scales),
                           args.iters)
    torch_ms = median_ms(lambda: reference.write_kv(*caches, keys, keys, slots, *scales),
                          args.iters)
    moved = 2 * keys.numel() * (keys.element_size() + problem.key_cache.element_size())
    return {"tokens": tokens, "triton_ms": triton_ms, "torch_index_put_ms": torch_ms,
            "triton_GBps": round(moved / triton_ms / 1e6, 1)}


def _contiguous_kv(problem: _Problem, batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The K/V of each sequence gathered once into [B, KV, L, D] in the query's dtype,
    dequantized from an FP8 cache (not timed)."""
    table = problem.metadata.block_tables.long()
    shape = (batch, -1, *problem.key_cache.shape[2:])
    dtype, scale = problem.query.dtype, problem.read_scales[0]

    def gather(cache: torch.Tensor) -> torch.Tensor:
        rows = cache.view(torch.uint8)[table].view(cache.dtype).to(dtype)
        rows = rows if scale is None else (rows * scale).to(dtype)
        return rows.reshape(shape)[:, :length].transpose(1, 2).contiguous()

    return gather(problem.key_cache), gather(problem.value_cache)


def _print(results: dict[str, Any]) -> None:
    print(f"{results['device']}  {results['shape']}")
    print("max |triton - reference|:", {k: f"{v:.2e}" for k, v in results["correctness"].items()})
    print(f"\n{'decode batch':>12} {'context':>8} {'triton ms':>10} {'sdpa ms':>9} {'ref ms':>9} "
          f"{'triton GB/s':>12} {'sdpa GB/s':>10}")
    for row in results["decode"]:
        print(f"{row['batch']:>12} {row['context']:>8} {row['triton_ms']:>10.3f} "
              f"{row['sdpa_contiguous_ms']:>9.3f} {row['reference_ms']:>9.3f} "
              f"{row['triton_kv_GBps']:>12.1f} {row['sdpa_kv_GBps']:>10.1f}")
    p = results["prefill"]
    print(f"\nprefill {p['batch']} x {p['new_tokens']} new over {p['cached_tokens']} cached: "
          f"triton {p['triton_ms']:.3f} ms ({p['triton_TFLOPs']} TFLOP/s), "
          f"sdpa {p['sdpa_contiguous_ms']:.3f} ms ({p['sdpa_TFLOPs']} TFLOP/s)")
    s = results["store_kv"]
    print(f"store_kv {s['tokens']} tokens: triton {s['triton_ms']:.3f} ms ({s['triton_GBps']} GB/s), "
          f"torch index_put {s['torch_index_put_ms']:.3f} ms")
    gpu_lora.print_results(results)
    if "kv_sizing" in results:
        print(gpu_sizing.describe(results["kv_sizing"]))


if __name__ == "__main__":
    main()
