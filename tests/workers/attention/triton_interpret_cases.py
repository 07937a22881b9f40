"""Triton kernels vs the torch reference on CPU tensors; run only under TRITON_INTERPRET=1.

Run as a module (``python -m``, from the repository root) in a subprocess by
test_triton_interpret.py, so the interpreter mode (fixed when a ``@triton.jit`` function
is defined) never leaks into the rest of the suite. Prints one JSON object: case name ->
max abs error, or the error text.
"""

from __future__ import annotations

import os

import torch

from tests.support.triton_interpreter import Cases
from tests.workers.attention.paged_cases import channel_scales, make_case
from workers.attention import reference, triton_kernels

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

CASES = Cases()
case = CASES.case



def prefill_error(
    block_size: int, num_heads: int, num_kv_heads: int, head_dim: int = 32, block_n: int = 64
) -> float:
    c = make_case([5, 1, 40, 17], [30, 47, 0, 16], block_size, num_heads, num_kv_heads, head_dim)
    m = c.metadata
    args = (c.query, c.key_cache, c.value_cache, m.query_start_loc, m.seq_lens, m.block_tables,
            m.max_query_len, c.scale)
    got = triton_kernels.paged_prefill(*args, block_n=block_n)
    return (got - reference.paged_prefill(*args)).abs().max().item()


def decode_error(
    block_size: int, num_heads: int, num_kv_heads: int, num_splits: int | None, block_n: int = 64
) -> float:
    c = make_case([1, 1, 1, 1], [0, 36, 99, 63], block_size, num_heads, num_kv_heads, seed=1)
    m = c.metadata
    args = (c.query, c.key_cache, c.value_cache, m.seq_lens, m.block_tables, c.scale)
    got = triton_kernels.paged_decode(*args, num_splits=num_splits, block_n=block_n)
    return (got - reference.paged_decode(*args)).abs().max().item()


for bs in (16, 32):
    for heads, kv_heads in ((4, 4), (4, 2), (8, 1)):
        case(f"prefill-bs{bs}-h{heads}-kv{kv_heads}")(
            lambda bs=bs, h=heads, kv=kv_heads: prefill_error(bs, h, kv)
        )
        for splits in (1, 3, None):
            case(f"decode-bs{bs}-h{heads}-kv{kv_heads}-splits{splits}")(
                lambda bs=bs, h=heads, kv=kv_heads, s=splits: decode_error(bs, h, kv, s)
            )
case("prefill-head-dim-24")(lambda: prefill_error(16, 4, 2, head_dim=24))
case("prefill-bs16-tile16")(lambda: prefill_error(16, 4, 2, block_n=16))
case("prefill-bs8-tile32")(lambda: prefill_error(8, 4, 2, block_n=32))
case("decode-bs32-tile16-splits3")(lambda: decode_error(32, 4, 2, 3, block_n=16))
case("decode-bs8-splits2")(lambda: decode_error(8, 8, 2, 2))


@case("store-kv")
def store_error() -> float:
    generator = torch.Generator().manual_seed(2)
    caches = [torch.randn(6, 16, 2, 32, generator=generator) for _ in range(2)]
    fused = torch.randn(9, 3, 2, 32, generator=generator)  # [T, k|v|other, kv_heads, D]
    key, value = fused[:, 0], fused[:, 1]  # strided views, as projections produce
    slots = torch.randperm(6 * 16, generator=generator)[:9]
    ours = [c.clone() for c in caches]
    reference.write_kv(*caches, key, value, slots)
    triton_kernels.store_kv(*ours, key, value, slots)
    return max((a - b).abs().max().item() for a, b in zip(caches, ours, strict=True))


@case("store-kv-padding-slots")
def store_padding_error() -> float:
    """Slot -1 (a padding row of a decode graph bucket) stores nothing, in both."""
    generator = torch.Generator().manual_seed(7)
    caches = [torch.randn(4, 16, 2, 32, generator=generator) for _ in range(2)]
    key, value = torch.randn(2, 5, 2, 32, generator=generator)
    slots = torch.tensor([3, -1, 17, -1, 40])
    ours = [c.clone() for c in caches]
    before = [c.clone() for c in caches]
    reference.write_kv(*caches, key, value, slots)
    triton_kernels.store_kv(*ours, key, value, slots)
    changed = sum(int((c != b).any(-1).any(-1).sum()) for c, b in zip(ours, before, strict=True))
    if changed != 6:  # 3 slots x key and value
        return float("inf")
    return max((a - b).abs().max().item() for a, b in zip(caches, ours, strict=True))


@case("decode-padding-rows")
def decode_padding_error() -> float:
    """Rows of length 0 (padding) read no key and give finite zeros, split or not;
    the real rows equal the reference."""
    c = make_case([1, 1, 1], [40, 0, 70], 16, 4, 2, seed=8)
    m = c.metadata
    seq_lens = m.seq_lens.clone()
    seq_lens[1] = 0
    worst = 0.0
    for splits in (1, 3):
        got = triton_kernels.paged_decode(c.query, c.key_cache, c.value_cache, seq_lens,
                                          m.block_tables, c.scale, num_splits=splits)
        if bool(got[1].any()) or not bool(torch.isfinite(got).all()):
            return float("inf")
        want = reference.paged_decode(c.query[[0, 2]], c.key_cache, c.value_cache,
                                      seq_lens[[0, 2]], m.block_tables[[0, 2]], c.scale)
        worst = max(worst, (got[[0, 2]] - want).abs().max().item())
    return worst


@case("decode-stale-nan-slots")
def stale_nan() -> float:
    c = make_case([1], [20], 16, seed=3)
    table = c.block_tables[0]
    c.key_cache[table[1], 5:] = float("nan")
    c.value_cache[table[1], 5:] = float("nan")
    m = c.metadata
    out = triton_kernels.paged_decode(c.query, c.key_cache, c.value_cache, m.seq_lens,
                                      m.block_tables, c.scale, num_splits=2)
    return 0.0 if bool(torch.isfinite(out).all()) else float("inf")


@case("rejects-non-contiguous-cache")
def rejects() -> float:
    c = make_case([1], [20], 16)
    try:
        triton_kernels.paged_decode(c.query, c.key_cache.transpose(2, 3), c.value_cache,
                                    c.metadata.seq_lens, c.metadata.block_tables, c.scale)
    except ValueError as exc:
        return 0.0 if "triton paged attention" in str(exc) else float("inf")
    return float("inf")


FP8 = {"e4m3": (torch.float8_e4m3fn, 3), "e5m2": (torch.float8_e5m2, 2)}


def fp8_caches(c, dtype: torch.dtype, seed: int):
    """The case's caches as an FP8 cache stores them (quantized by the reference with
    random per-channel scales and K offsets), and those scales."""
    k_scale, k_offset, v_scale = channel_scales(*c.key_cache.shape[2:], seed=seed)
    key_cache = reference.quantize(c.key_cache * 40 * k_scale + k_offset, dtype, k_scale, k_offset)
    value_cache = reference.quantize(c.value_cache * 40 * v_scale, dtype, v_scale)
    return key_cache, value_cache, k_scale, k_offset, v_scale


def fp8_prefill_error(fmt: str) -> float:
    c = make_case([5, 1, 40, 17], [30, 47, 0, 16], 16, 4, 2, seed=4)
    key_cache, value_cache, k_scale, _, v_scale = fp8_caches(c, FP8[fmt][0], seed=7)
    m = c.metadata
    args = (c.query, key_cache, value_cache, m.query_start_loc, m.seq_lens, m.block_tables,
            m.max_query_len, c.scale, k_scale, v_scale)
    return (triton_kernels.paged_prefill(*args) - reference.paged_prefill(*args)).abs().max().item()


def fp8_decode_error(fmt: str, num_splits: int) -> float:
    c = make_case([1, 1, 1, 1], [0, 36, 99, 63], 16, 8, 2, seed=5)
    key_cache, value_cache, k_scale, _, v_scale = fp8_caches(c, FP8[fmt][0], seed=8)
    m = c.metadata
    args = (c.query, key_cache, value_cache, m.seq_lens, m.block_tables, c.scale, k_scale, v_scale)
    got = triton_kernels.paged_decode(*args, num_splits=num_splits)
    return (got - reference.paged_decode(*args)).abs().max().item()


def fp8_store_error(fmt: str) -> float:
    """The kernel's stored values == the reference's. Inputs are FP8 values times a
    power-of-two scale plus a K offset of a few eighths (so every step is exact in
    float32), plus some far beyond the range, which saturate: no rounding is needed,
    since the interpreter's own float32 -> float8 conversion drops the carry of a
    mantissa that rounds up (500 -> 256 in e5m2), which the GPU's conversion does not;
    random inputs are compared on a GPU (test_triton_gpu.py)."""
    dtype = FP8[fmt][0]
    generator = torch.Generator().manual_seed(6)
    exact = torch.randn(2, 9, 2, 32, generator=generator).mul(4).to(dtype).float()
    exact[1, 0, 0, :4] = torch.tensor([1e9, -1e9, 6e4, -6e4])
    k_scale, v_scale = (2.0 ** torch.randint(-2, 3, (2, 32), generator=generator).float()
                        for _ in range(2))
    k_offset = torch.randint(-8, 9, (2, 32), generator=generator).float() / 8
    key, value = exact[0] * k_scale + k_offset, exact[1] * v_scale
    slots = torch.randperm(6 * 16, generator=generator)[:9]
    ref = [torch.zeros(6, 16, 2, 32, dtype=dtype) for _ in range(2)]
    ours = [torch.zeros(6, 16, 2, 32, dtype=dtype) for _ in range(2)]
    reference.write_kv(*ref, key, value, slots, k_scale, k_offset, v_scale)
    triton_kernels.store_kv(*ours, key, value, slots, k_scale, k_offset, v_scale)
    return max((a.float() - b.float()).abs().max().item() for a, b in zip(ref, ours, strict=True))


@case("fp8-rejects-bad-scales")
def rejects_bad_scales() -> float:
    """Scales on a cache not in FP8, some scales without the others, or scales of
    another shape are refused before any launch."""
    c = make_case([1], [20], 16, seed=9)
    m = c.metadata
    k_scale, k_offset, v_scale = channel_scales(2, 32)
    fp8 = [cache.to(torch.float8_e4m3fn) for cache in (c.key_cache, c.value_cache)]
    calls = [
        lambda: triton_kernels.paged_decode(c.query, c.key_cache, c.value_cache, m.seq_lens,
                                            m.block_tables, c.scale, k_scale, v_scale),
        lambda: triton_kernels.paged_decode(c.query, *fp8, m.seq_lens, m.block_tables,
                                            c.scale, k_scale, None),
        lambda: triton_kernels.paged_decode(c.query, *fp8, m.seq_lens, m.block_tables,
                                            c.scale, k_scale[:, :16], v_scale[:, :16]),
        lambda: triton_kernels.store_kv(*fp8, c.key_cache[0], c.value_cache[0],
                                        torch.arange(16), k_scale, None, v_scale),
    ]
    for call in calls:
        try:
            call()
        except ValueError as exc:
            if "triton paged attention" not in str(exc):
                return float("inf")
            continue
        return float("inf")
    return 0.0


for fmt in FP8:
    case(f"fp8-{fmt}-prefill")(lambda fmt=fmt: fp8_prefill_error(fmt))
    case(f"fp8-{fmt}-store-kv")(lambda fmt=fmt: fp8_store_error(fmt))
    for splits in (1, 3):
        case(f"fp8-{fmt}-decode-splits{splits}")(
            lambda fmt=fmt, s=splits: fp8_decode_error(fmt, s)
        )


if __name__ == "__main__":
    CASES.report()
