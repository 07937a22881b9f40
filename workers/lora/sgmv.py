"""The grouped LoRA delta in Triton: segment-indexed shrink and expand (punica's SGMV).

Same contract as ``workers.lora.reference`` (the oracle): each run of rows
``starts[i]:ends[i]`` gets ``x·A[slot]ᵀ·B[slot]ᵀ·scales[slot]``; every other row is
zero. Two launches, as punica does, rather than one fused kernel: a fused program
that owns an output tile would redo the whole shrink (``in_features × rank`` per
row) once per output tile, which multiplies the shrink's work by the number of
output tiles; split in two, each weight is read once per row tile.

- **Shrink**: a program per (row tile of a run, rank tile, split of ``in_features``)
  writes its fp32 partial product into ``partials [num_splits, num_tokens,
  max_rank]``. Splitting ``in_features`` fills the GPU when a decode batch has only
  a few row tiles; each split owns its own partial, so the sum is deterministic.
- **Expand**: a program per (row tile of a run, output tile) sums the splits'
  partials, multiplies by ``B[slot]ᵀ`` a rank tile at a time, scales and stores.

Row tiles are numbered across runs without a device sync: run ``i`` has
``ceil(len_i / BLOCK_M)`` tiles, so the total is at most ``ceil(num_tokens / BLOCK_M)
+ num_segments``; each program finds its run from the running sum of tile counts
and programs past the last tile return at once. A tile never spans two runs, so a
tile reads one slot's weights. Rank is padded to ``max_rank`` and masked up to
``tl.dot``'s smallest power-of-two tile; padded rank rows are zero in the slot
buffers, so they add nothing. Products accumulate in fp32; fp32 inputs use
``input_precision="ieee"`` (no silent TF32). The shrunk rows are rounded to the
input dtype before the expand's ``tl.dot``, as the reference rounds ``x·Aᵀ``.

The Triton interpreter multiplies the raw bits of bfloat16 ``tl.dot`` operands
(triton-lang/triton#11584, unsupported upstream), so under ``TRITON_INTERPRET=1``
bfloat16 tiles are widened to fp32 just before each ``tl.dot``; loads, stores and
the rounding of the shrunk rows stay in bfloat16. Compiled kernels never widen.

Runs on CUDA, and on CPU tensors under ``TRITON_INTERPRET=1`` (tests).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from workers.lora.segments import LoraSegments

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_TARGET_SHRINK_PROGRAMS = 264  # two waves of a 132-SM GPU
_MAX_SPLITS = 16  # the expand re-reads every split's partial
_MIN_TILE = 16  # tl.dot's smallest dimension
_MAX_RANK_TILE = 64
_LONG_RUN_ROWS = 64  # runs this long on average get tiles of this many rows


@triton.jit
def _row_tile(starts_ptr, ends_ptr, slots_ptr, num_segments,
              SEGMENTS_P: tl.constexpr, BLOCK_M: tl.constexpr):
    """This program's run (``num_segments`` past the last tile), its slot, the
    tile's rows and which of them lie inside the run."""
    segment_ids = tl.arange(0, SEGMENTS_P)
    listed = segment_ids < num_segments
    run_starts = tl.load(starts_ptr + segment_ids, mask=listed, other=0)
    run_ends = tl.load(ends_ptr + segment_ids, mask=listed, other=0)
    tiles = (run_ends - run_starts + BLOCK_M - 1) // BLOCK_M
    tiles_before_next = tl.cumsum(tiles, 0)
    tile_id = tl.program_id(0)
    segment = tl.sum((tiles_before_next <= tile_id).to(tl.int32), 0)
    mine = segment_ids == segment
    first_tile = tl.sum(tl.where(mine, tiles_before_next - tiles, 0), 0)
    row_start = tl.sum(tl.where(mine, run_starts, 0), 0) + (tile_id - first_tile) * BLOCK_M
    run_end = tl.sum(tl.where(mine, run_ends, 0), 0)
    slot = tl.load(slots_ptr + segment, mask=segment < num_segments, other=0)
    rows = row_start.to(tl.int64) + tl.arange(0, BLOCK_M)
    return segment, slot.to(tl.int64), rows, rows < run_end


@triton.jit
def _shrink_kernel(
    x_ptr, a_ptr, partial_ptr, starts_ptr, ends_ptr, slots_ptr, num_segments,
    stride_xt, stride_as, stride_ar, stride_ps, stride_pt,
    IN_FEATURES: tl.constexpr, MAX_RANK: tl.constexpr, K_PER_SPLIT: tl.constexpr,
    SEGMENTS_P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, DOT_FP32: tl.constexpr,
):
    segment, slot, rows, row_ok = _row_tile(
        starts_ptr, ends_ptr, slots_ptr, num_segments, SEGMENTS_P, BLOCK_M
    )
    if segment >= num_segments:
        return
    ranks = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    rank_ok = ranks < MAX_RANK
    split = tl.program_id(2)
    k_start = split * K_PER_SPLIT
    k_end = tl.minimum(k_start + K_PER_SPLIT, IN_FEATURES)
    a_rows = a_ptr + slot * stride_as + ranks.to(tl.int64) * stride_ar
    acc = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)
    for k0 in range(k_start, k_end, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < k_end
        x = tl.load(x_ptr + rows[:, None] * stride_xt + ks[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        a_t = tl.load(a_rows[None, :] + ks[:, None], mask=k_ok[:, None] & rank_ok[None, :],
                      other=0.0)
        if DOT_FP32:
            x = x.to(tl.float32)
            a_t = a_t.to(tl.float32)
        acc += tl.dot(x, a_t, input_precision=PRECISION)
    out = partial_ptr + split * stride_ps + rows[:, None] * stride_pt + ranks[None, :]
    tl.store(out, acc, mask=row_ok[:, None] & rank_ok[None, :])


@triton.jit
def _expand_kernel(
    partial_ptr, b_ptr, scales_ptr, out_ptr, starts_ptr, ends_ptr, slots_ptr, num_segments,
    stride_ps, stride_pt, stride_bs, stride_bo, stride_ot,
    OUT_FEATURES: tl.constexpr, MAX_RANK: tl.constexpr, NUM_SPLITS: tl.constexpr,
    SEGMENTS_P: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, DOT_FP32: tl.constexpr,
):
    segment, slot, rows, row_ok = _row_tile(
        starts_ptr, ends_ptr, slots_ptr, num_segments, SEGMENTS_P, BLOCK_M
    )
    if segment >= num_segments:
        return
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < OUT_FEATURES
    b_cols = b_ptr + slot * stride_bs + cols.to(tl.int64) * stride_bo
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for r0 in range(0, MAX_RANK, BLOCK_R):
        ranks = r0 + tl.arange(0, BLOCK_R)
        rank_ok = ranks < MAX_RANK
        shrunk = tl.zeros([BLOCK_M, BLOCK_R], tl.float32)
        for split in range(NUM_SPLITS):
            shrunk += tl.load(
                partial_ptr + split * stride_ps + rows[:, None] * stride_pt + ranks[None, :],
                mask=row_ok[:, None] & rank_ok[None, :], other=0.0,
            )
        b_t = tl.load(b_cols[None, :] + ranks[:, None], mask=rank_ok[:, None] & col_ok[None, :],
                      other=0.0)
        rounded = shrunk.to(b_t.dtype)
        if DOT_FP32:
            rounded = rounded.to(tl.float32)
            b_t = b_t.to(tl.float32)
        acc += tl.dot(rounded, b_t, input_precision=PRECISION)
    acc *= tl.load(scales_ptr + slot).to(tl.float32)
    out = out_ptr + rows[:, None] * stride_ot + cols[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def _check_tiles(block_m: int | None, block_n: int, block_k: int,
                 num_splits: int | None) -> None:
    """Tile sizes are powers of two, at least ``tl.dot``'s minimum; splits at least 1."""
    tiles = {"block_m": block_m or _MIN_TILE, "block_n": block_n, "block_k": block_k}
    for name, size in tiles.items():
        _check(size >= _MIN_TILE and size & (size - 1) == 0,
               f"{name} must be a power of two >= {_MIN_TILE}")
    _check(num_splits is None or num_splits >= 1, "num_splits must be >= 1")


def lora_delta_triton(
    x: torch.Tensor,
    segments: LoraSegments,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scales: torch.Tensor,
    block_m: int | None = None,
    block_n: int = 64,
    block_k: int = 64,
    num_splits: int | None = None,
) -> torch.Tensor:
    """``[num_tokens, out_features]`` in ``x``'s dtype; same contract as
    ``reference.lora_delta_reference``.

    The caller guarantees that runs lie inside ``x`` and slots inside the slot
    buffers (checking values would need a device sync). ``block_m`` rows per tile
    (default: small tiles for decode-like batches, large ones when runs are long);
    ``num_splits`` splits of ``in_features`` in the shrink (default: enough programs
    to fill the GPU, judged from shapes only, so no device sync is needed). Tile
    sizes are powers of two, at least ``tl.dot``'s minimum.
    """
    _check_arguments(x, segments, lora_a, lora_b, scales)
    _check_tiles(block_m, block_n, block_k, num_splits)
    num_tokens, in_features = x.shape
    num_segments = segments.num_segments
    out = x.new_zeros(num_tokens, lora_b.shape[1])
    if out.numel() == 0 or num_segments == 0 or in_features == 0:
        return out
    max_rank = lora_a.shape[1]
    t = _tiling(num_tokens, num_segments, in_features, max_rank, block_m, block_k, num_splits)
    partials = x.new_empty((t.num_splits, num_tokens, max_rank), dtype=torch.float32)
    run_args = (segments.starts, segments.ends, segments.slots, num_segments)
    dot_fp32 = x.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"
    common = dict(MAX_RANK=max_rank, SEGMENTS_P=max(_MIN_TILE, triton.next_power_of_2(num_segments)),
                  BLOCK_M=t.block_m, BLOCK_R=t.block_r, DOT_FP32=dot_fp32,
                  PRECISION="ieee" if x.dtype == torch.float32 or dot_fp32 else "tf32")
    _shrink_kernel[(t.row_tiles, t.rank_tiles, t.num_splits)](
        x, lora_a, partials, *run_args,
        x.stride(0), lora_a.stride(0), lora_a.stride(1), partials.stride(0), partials.stride(1),
        IN_FEATURES=in_features, K_PER_SPLIT=t.k_per_split, BLOCK_K=block_k, **common,
    )
    _expand_kernel[(t.row_tiles, triton.cdiv(out.shape[1], block_n))](
        partials, lora_b, scales, out, *run_args,
        partials.stride(0), partials.stride(1), lora_b.stride(0), lora_b.stride(1), out.stride(0),
        OUT_FEATURES=out.shape[1], NUM_SPLITS=t.num_splits, BLOCK_N=block_n, **common,
    )
    return out


class _Tiling(NamedTuple):
    """Tile sizes and grid extents of one call."""

    block_m: int
    block_r: int
    row_tiles: int
    rank_tiles: int
    num_splits: int
    k_per_split: int


def _tiling(num_tokens: int, num_segments: int, in_features: int, max_rank: int,
            block_m: int | None, block_k: int, num_splits: int | None) -> _Tiling:
    """Tile sizes and grid extents from shapes alone (no device sync). Splits cover
    whole ``block_k`` tiles, so fewer may remain than were asked for."""
    if block_m is None:
        long_runs = num_tokens >= _LONG_RUN_ROWS * num_segments
        block_m = _LONG_RUN_ROWS if long_runs else _MIN_TILE
    block_r = min(_MAX_RANK_TILE, max(_MIN_TILE, triton.next_power_of_2(max_rank)))
    row_tiles = triton.cdiv(num_tokens, block_m) + num_segments
    rank_tiles = triton.cdiv(max_rank, block_r)
    k_tiles = triton.cdiv(in_features, block_k)
    if num_splits is None:
        wanted = triton.cdiv(_TARGET_SHRINK_PROGRAMS, row_tiles * rank_tiles)
        num_splits = min(wanted, k_tiles, _MAX_SPLITS)
    k_per_split = triton.cdiv(k_tiles, num_splits) * block_k
    num_splits = triton.cdiv(in_features, k_per_split)
    return _Tiling(block_m, block_r, row_tiles, rank_tiles, num_splits, k_per_split)


def _check_arguments(
    x: torch.Tensor,
    segments: LoraSegments,
    lora_a: torch.Tensor,
    lora_b: torch.Tensor,
    scales: torch.Tensor,
) -> None:
    """Shapes, dtypes, strides and devices, each error naming the argument."""
    _check(x.dim() == 2, f"x must be [num_tokens, in_features], got {tuple(x.shape)}")
    _check(x.dtype in _DTYPES, f"x dtype must be one of {_DTYPES}, got {x.dtype}")
    _check(x.stride(1) == 1 or x.shape[1] <= 1, "x must have a unit stride on in_features")
    _check(lora_a.dim() == 3 and lora_a.shape[2] == x.shape[1] and lora_a.shape[1] >= 1,
           f"lora_a must be [num_slots, max_rank >= 1, {x.shape[1]}], got {tuple(lora_a.shape)}")
    num_slots, max_rank = lora_a.shape[:2]
    _check(lora_b.dim() == 3 and lora_b.shape[0] == num_slots and lora_b.shape[2] == max_rank,
           f"lora_b must be [{num_slots}, out_features, {max_rank}], got {tuple(lora_b.shape)}")
    _check(scales.shape == (num_slots,), f"scales must be [{num_slots}], got {tuple(scales.shape)}")
    _check(scales.dtype in _DTYPES, f"scales dtype must be one of {_DTYPES}, got {scales.dtype}")
    for name, weights in (("lora_a", lora_a), ("lora_b", lora_b)):
        _check(weights.dtype == x.dtype, f"{name} dtype {weights.dtype} != x dtype {x.dtype}")
        _check(weights.is_contiguous(), f"{name} must be contiguous")
    tensors = {"lora_a": lora_a, "lora_b": lora_b, "scales": scales}
    for field in ("starts", "ends", "slots"):
        index = getattr(segments, field)
        tensors[f"segments.{field}"] = index
        _check(index.dtype == torch.int64 and index.shape == (segments.num_segments,)
               and index.is_contiguous(),
               f"segments.{field} must be contiguous int64 [{segments.num_segments}]")
    for name, tensor in tensors.items():
        _check(tensor.device == x.device, f"{name} is on {tensor.device}, x on {x.device}")


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"lora_delta_triton: {message}")
