"""Triton kernels for the paged KV cache: K/V store, paged decode, paged prefill.

Same contracts as ``workers.attention.reference`` (the oracle), one checked wrapper
per kernel. Caches are ``[num_blocks, block_size, num_kv_heads, head_dim]``, so one
token's K (or V) for all KV heads is a contiguous run, and one key of one head is a
contiguous ``head_dim`` row: a tile of keys is a gather of rows, each found through
the block table (a tile of ``BLOCK_N`` keys may span several pages).

Both attention kernels put the query heads that share one KV head in the rows of
one tile (``GROUP`` rows per query token), so each K/V row is loaded once per KV
head, not once per query head. Softmax is the online (flash) form in base 2. The
decode kernel splits long sequences into ``num_splits`` key ranges run by separate
programs (flash-decoding) and a second kernel merges the partial results, so a small
batch still fills the GPU.

FP8 caches (float8_e4m3fn, float8_e5m2) follow the reference: the store kernel
subtracts each K channel's offset, divides by each channel's scale and saturates
before the cast; the attention kernels multiply the query tile by its KV head's K
scales once, convert each loaded K/V tile to the query's dtype (exact), and apply the
V scales to the output once, so no extra pass over the cache runs (the K offsets
shift every score of a query alike, which softmax ignores).

Runs on CUDA, and on CPU tensors under ``TRITON_INTERPRET=1`` (tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634
_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


@triton.jit
def _store_kv_kernel(
    key_ptr, value_ptr, key_cache_ptr, value_cache_ptr, slot_ptr,
    k_scale_ptr, k_offset_ptr, v_scale_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    HEADS_P: tl.constexpr, DIM_P: tl.constexpr, FP8_MAX: tl.constexpr, HAS_SCALES: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:  # a padding row of a captured decode bucket: nothing to store
        return
    heads = tl.arange(0, HEADS_P)[:, None]
    dims = tl.arange(0, DIM_P)[None, :]
    mask = (heads < NUM_KV_HEADS) & (dims < HEAD_DIM)
    cache_offsets = slot * NUM_KV_HEADS * HEAD_DIM + heads * HEAD_DIM + dims
    key = tl.load(key_ptr + token * stride_kt + heads * stride_kh + dims, mask=mask)
    value = tl.load(value_ptr + token * stride_vt + heads * stride_vh + dims, mask=mask)
    if FP8_MAX > 0:
        key = key.to(tl.float32)
        value = value.to(tl.float32)
        if HAS_SCALES:
            channel = heads * HEAD_DIM + dims
            key = (key - tl.load(k_offset_ptr + channel, mask=mask, other=0.0)) / tl.load(
                k_scale_ptr + channel, mask=mask, other=1.0)
            value = value / tl.load(v_scale_ptr + channel, mask=mask, other=1.0)
        key = tl.minimum(tl.maximum(key, -FP8_MAX), FP8_MAX)
        value = tl.minimum(tl.maximum(value, -FP8_MAX), FP8_MAX)
    tl.store(key_cache_ptr + cache_offsets, key.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(value_cache_ptr + cache_offsets, value.to(value_cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _attend_tile(
    q, acc, m_i, l_i, key_cache_ptr, value_cache_ptr, block_table_ptr, tile_start, kv_head,
    query_pos, seq_len, qk_scale,
    stride_cb, stride_cs, stride_ch,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, DIM_P: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):
    """One online-softmax step of a row tile over keys [tile_start, tile_start + BLOCK_N).

    Each key finds its page through the block table, so a tile may span several
    pages. Keys past ``seq_len`` are neither looked up (the table row may end there)
    nor read (stale slots may hold NaN): they load as zeros and score -inf.
    """
    key_pos = tile_start + tl.arange(0, BLOCK_N)
    in_seq = key_pos < seq_len
    block_ids = tl.load(block_table_ptr + key_pos // BLOCK_SIZE, mask=in_seq, other=0)
    kv_offsets = block_ids.to(tl.int64) * stride_cb + (key_pos % BLOCK_SIZE) * stride_cs
    kv_offsets += kv_head * stride_ch
    dims = tl.arange(0, DIM_P)
    dim_ok = dims < HEAD_DIM
    k_t = tl.load(
        key_cache_ptr + kv_offsets[None, :] + dims[:, None],
        mask=dim_ok[:, None] & in_seq[None, :], other=0.0,
    ).to(q.dtype)
    scores = tl.dot(q, k_t, input_precision=PRECISION) * qk_scale
    visible = (key_pos[None, :] <= query_pos[:, None]) & in_seq[None, :]
    scores = tl.where(visible, scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(scores - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    v = tl.load(
        value_cache_ptr + kv_offsets[:, None] + dims[None, :],
        mask=in_seq[:, None] & dim_ok[None, :], other=0.0,
    ).to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return acc, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def _scaled_query(q, k_scale_ptr, kv_head, dims, HEAD_DIM: tl.constexpr):
    """Query rows of one KV head times its K scales (per channel), in the query's dtype."""
    k_scale = tl.load(k_scale_ptr + kv_head * HEAD_DIM + dims, mask=dims < HEAD_DIM, other=1.0)
    return (q.to(tl.float32) * k_scale[None, :]).to(q.dtype)


@triton.jit
def _scaled_out(out, v_scale_ptr, kv_head, dims, HEAD_DIM: tl.constexpr):
    """Output rows of one KV head times its V scales (per channel)."""
    v_scale = tl.load(v_scale_ptr + kv_head * HEAD_DIM + dims, mask=dims < HEAD_DIM, other=1.0)
    return out * v_scale[None, :]


@triton.jit
def _paged_prefill_kernel(
    query_ptr, key_cache_ptr, value_cache_ptr, out_ptr,
    query_start_ptr, seq_lens_ptr, block_tables_ptr, qk_scale, k_scale_ptr, v_scale_ptr,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
    stride_cb, stride_cs, stride_ch,
    GROUP: tl.constexpr, GROUP_P: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_P: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr, HAS_SCALES: tl.constexpr,
):
    seq = tl.program_id(0)
    tile = tl.program_id(1)
    kv_head = tl.program_id(2)
    query_start = tl.load(query_start_ptr + seq)
    query_len = tl.load(query_start_ptr + seq + 1) - query_start
    if tile * BLOCK_Q >= query_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    context_len = seq_len - query_len
    rows = tl.arange(0, BLOCK_Q * GROUP_P)
    token = tile * BLOCK_Q + rows // GROUP_P
    head = kv_head * GROUP + rows % GROUP_P
    row_ok = (token < query_len) & (rows % GROUP_P < GROUP)
    dims = tl.arange(0, DIM_P)
    io_mask = row_ok[:, None] & (dims[None, :] < HEAD_DIM)
    q_offsets = (query_start + token)[:, None].to(tl.int64) * stride_qt + head[:, None] * stride_qh
    q = tl.load(query_ptr + q_offsets + dims[None, :], mask=io_mask, other=0.0)
    if HAS_SCALES:
        q = _scaled_query(q, k_scale_ptr, kv_head, dims, HEAD_DIM)
    query_pos = context_len + token
    m_i = tl.full([BLOCK_Q * GROUP_P], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q * GROUP_P], tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_P, DIM_P], tl.float32)
    # Keys this tile can see: the prefix plus new tokens up to the tile's last row.
    kv_len = tl.minimum(seq_len, context_len + (tile + 1) * BLOCK_Q)
    block_table_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for tile_start in range(0, kv_len, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, key_cache_ptr, value_cache_ptr, block_table_ptr, tile_start,
            kv_head, query_pos, seq_len, qk_scale, stride_cb, stride_cs, stride_ch,
            HEAD_DIM, BLOCK_SIZE, DIM_P, BLOCK_N, PRECISION,
        )
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    if HAS_SCALES:
        out = _scaled_out(out, v_scale_ptr, kv_head, dims, HEAD_DIM)
    o_offsets = (query_start + token)[:, None].to(tl.int64) * stride_ot + head[:, None] * stride_oh
    tl.store(out_ptr + o_offsets + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=io_mask)


@triton.jit
def _paged_decode_kernel(
    query_ptr, key_cache_ptr, value_cache_ptr, out_ptr, part_acc_ptr, part_ml_ptr,
    seq_lens_ptr, block_tables_ptr, qk_scale, k_scale_ptr, v_scale_ptr,
    stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
    stride_cb, stride_cs, stride_ch,
    NUM_HEADS: tl.constexpr, NUM_SPLITS: tl.constexpr,
    GROUP: tl.constexpr, GROUP_P: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_P: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
    HAS_SCALES: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    tiles_per_split = tl.cdiv(tl.cdiv(seq_len, BLOCK_N), NUM_SPLITS)
    rows = tl.arange(0, GROUP_P)
    head = kv_head * GROUP + rows
    row_ok = rows < GROUP
    dims = tl.arange(0, DIM_P)
    io_mask = row_ok[:, None] & (dims[None, :] < HEAD_DIM)
    q_offsets = seq.to(tl.int64) * stride_qt + head[:, None] * stride_qh + dims[None, :]
    q = tl.load(query_ptr + q_offsets, mask=io_mask, other=0.0)
    if HAS_SCALES:
        q = _scaled_query(q, k_scale_ptr, kv_head, dims, HEAD_DIM)
    query_pos = tl.zeros([GROUP_P], tl.int32) + seq_len - 1
    m_i = tl.full([GROUP_P], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_P], tl.float32)
    acc = tl.zeros([GROUP_P, DIM_P], tl.float32)
    first_key = split * tiles_per_split * BLOCK_N
    last_key = tl.minimum(first_key + tiles_per_split * BLOCK_N, seq_len)
    block_table_ptr = block_tables_ptr + seq.to(tl.int64) * stride_bt
    for tile_start in range(first_key, last_key, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            q, acc, m_i, l_i, key_cache_ptr, value_cache_ptr, block_table_ptr, tile_start,
            kv_head, query_pos, seq_len, qk_scale, stride_cb, stride_cs, stride_ch,
            HEAD_DIM, BLOCK_SIZE, DIM_P, BLOCK_N, PRECISION,
        )
    if HAS_SCALES:
        acc = _scaled_out(acc, v_scale_ptr, kv_head, dims, HEAD_DIM)
    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        o_offsets = seq.to(tl.int64) * stride_ot + head[:, None] * stride_oh + dims[None, :]
        tl.store(out_ptr + o_offsets, out.to(out_ptr.dtype.element_ty), mask=io_mask)
    else:
        part = (seq * NUM_HEADS + head) * NUM_SPLITS + split
        tl.store(part_acc_ptr + part[:, None] * DIM_P + dims[None, :], acc, mask=row_ok[:, None])
        tl.store(part_ml_ptr + part * 2, m_i, mask=row_ok)
        tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=row_ok)


@triton.jit
def _decode_reduce_kernel(
    out_ptr, part_acc_ptr, part_ml_ptr, stride_ot, stride_oh,
    NUM_HEADS: tl.constexpr, NUM_SPLITS: tl.constexpr, SPLITS_P: tl.constexpr,
    HEAD_DIM: tl.constexpr, DIM_P: tl.constexpr,
):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    splits = tl.arange(0, SPLITS_P)
    split_ok = splits < NUM_SPLITS
    dims = tl.arange(0, DIM_P)
    part = (seq * NUM_HEADS + head) * NUM_SPLITS + splits
    m = tl.load(part_ml_ptr + part * 2, mask=split_ok, other=float("-inf"))
    l_part = tl.load(part_ml_ptr + part * 2 + 1, mask=split_ok, other=0.0)
    acc = tl.load(
        part_acc_ptr + part[:, None] * DIM_P + dims[None, :], mask=split_ok[:, None], other=0.0
    )
    m_max = tl.max(m, 0)
    weight = tl.where(m == float("-inf"), 0.0, tl.exp2(m - m_max))
    denominator = tl.sum(l_part * weight, 0)
    out = tl.sum(acc * weight[:, None], 0) / tl.where(denominator == 0.0, 1.0, denominator)
    tl.store(out_ptr + seq * stride_ot + head * stride_oh + dims, out.to(out_ptr.dtype.element_ty),
             mask=dims < HEAD_DIM)


def store_kv(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    k_offset: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Store ``key``/``value`` [T, kv_heads, head_dim] into cache slots ``slot_mapping`` [T]
    int64, K less its offsets, both divided by their scales (all three float32
    [kv_heads, head_dim], or all None) and saturated when the cache is FP8. A negative
    slot (a padding row) stores nothing."""
    _check_cache(key_cache, value_cache)
    num_kv_heads, head_dim = key_cache.shape[2:]
    for name, tensor in (("key", key), ("value", value)):
        _check(tensor.dim() == 3 and tuple(tensor.shape[1:]) == (num_kv_heads, head_dim),
               f"{name} must be [T, {num_kv_heads}, {head_dim}], got {tuple(tensor.shape)}")
        _check(
            tensor.dtype == key_cache.dtype or key_cache.dtype in _FP8_DTYPES,
            f"{name} dtype {tensor.dtype} != cache {key_cache.dtype}",
        )
        _check(tensor.stride(2) == 1, f"{name} must have a unit stride on head_dim")
        _check(tensor.device == key_cache.device, f"{name} is not on the cache's device")
    _check(slot_mapping.dtype == torch.int64 and slot_mapping.shape == (key.shape[0],),
           "slot_mapping must be int64 [T]")
    _check(value.shape[0] == key.shape[0], "key and value must have the same number of tokens")
    if key.shape[0] == 0:
        return
    params = _check_scales(key_cache, k_scale, k_offset, v_scale)
    fp8_max = torch.finfo(key_cache.dtype).max if key_cache.dtype in _FP8_DTYPES else 0.0
    _store_kv_kernel[(key.shape[0],)](
        key, value, key_cache, value_cache, slot_mapping, *params,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        HEADS_P=triton.next_power_of_2(num_kv_heads), DIM_P=triton.next_power_of_2(head_dim),
        FP8_MAX=fp8_max, HAS_SCALES=k_scale is not None,
    )


def paged_prefill(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    max_query_len: int,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    rows_per_tile: int = 64,
    block_n: int = 64,
) -> torch.Tensor:
    """Paged prefill over cached prefixes; same contract as ``reference.paged_prefill``.

    A tile holds ``rows_per_tile // group`` query tokens times their ``group`` heads
    (a power of two >= 16, so ``tl.dot`` gets at least 16 rows) and walks the keys
    ``block_n`` at a time.
    """
    group = _check_attention(query, key_cache, value_cache, seq_lens, block_tables, block_n)
    params = _check_scales(key_cache, k_scale, v_scale)
    _check(query_start_loc.dtype == torch.int32 and query_start_loc.shape == (seq_lens.shape[0] + 1,),
           "query_start_loc must be int32 [B + 1]")
    out = torch.empty_like(query)
    _check(rows_per_tile >= 16 and rows_per_tile & (rows_per_tile - 1) == 0,
           "rows_per_tile must be a power of two >= 16")
    group_p = triton.next_power_of_2(group)
    block_q = max(1, rows_per_tile // group_p)
    block_size, num_kv_heads, head_dim = key_cache.shape[1:]
    grid = (seq_lens.shape[0], triton.cdiv(max_query_len, block_q), num_kv_heads)
    _paged_prefill_kernel[grid](
        query, key_cache, value_cache, out, query_start_loc, seq_lens, block_tables,
        scale * _LOG2E, *params, query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        block_tables.stride(0), *key_cache.stride()[:3],
        GROUP=group, GROUP_P=group_p, HEAD_DIM=head_dim,
        DIM_P=max(16, triton.next_power_of_2(head_dim)), BLOCK_SIZE=block_size, BLOCK_Q=block_q,
        BLOCK_N=block_n, PRECISION=_precision(query.dtype), HAS_SCALES=k_scale is not None,
    )
    return out


def paged_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    num_splits: int | None = None,
    block_n: int = 64,
) -> torch.Tensor:
    """Paged decode, one query per sequence; same contract as ``reference.paged_decode``.

    Each sequence's keys are cut into ``num_splits`` ranges of whole ``block_n`` tiles
    (default: enough programs for about four waves of 132 SMs, at least two tiles per
    range, judged from the block-table width so no device sync is needed).
    """
    group = _check_attention(query, key_cache, value_cache, seq_lens, block_tables, block_n)
    params = _check_scales(key_cache, k_scale, v_scale)
    _check(query.shape[0] == seq_lens.shape[0], "decode needs exactly one query per sequence")
    num_seqs, num_heads = query.shape[:2]
    block_size, num_kv_heads, head_dim = key_cache.shape[1:]
    if num_splits is None:
        max_tiles = triton.cdiv(block_tables.shape[1] * block_size, block_n)
        num_splits = max(
            1, min(triton.cdiv(528, num_seqs * num_kv_heads), triton.cdiv(max_tiles, 2))
        )
    _check(num_splits >= 1, "num_splits must be >= 1")
    dim_p = max(16, triton.next_power_of_2(head_dim))
    out = torch.empty_like(query)
    part_acc = query.new_empty((num_seqs * num_heads * num_splits, dim_p), dtype=torch.float32)
    part_ml = query.new_empty((num_seqs * num_heads * num_splits, 2), dtype=torch.float32)
    _paged_decode_kernel[(num_seqs, num_kv_heads, num_splits)](
        query, key_cache, value_cache, out, part_acc, part_ml, seq_lens, block_tables,
        scale * _LOG2E, *params, query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        block_tables.stride(0), *key_cache.stride()[:3],
        NUM_HEADS=num_heads, NUM_SPLITS=num_splits, GROUP=group,
        GROUP_P=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim, DIM_P=dim_p,
        BLOCK_SIZE=block_size, BLOCK_N=block_n, PRECISION=_precision(query.dtype),
        HAS_SCALES=k_scale is not None,
    )
    if num_splits > 1:
        _decode_reduce_kernel[(num_seqs, num_heads)](
            out, part_acc, part_ml, out.stride(0), out.stride(1),
            NUM_HEADS=num_heads, NUM_SPLITS=num_splits,
            SPLITS_P=triton.next_power_of_2(num_splits), HEAD_DIM=head_dim, DIM_P=dim_p,
        )
    return out


def _check_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    block_n: int,
) -> int:
    """Validate the shared arguments; return query heads per KV head."""
    _check_cache(key_cache, value_cache)
    num_kv_heads, head_dim = key_cache.shape[2:]
    _check(query.dim() == 3 and query.shape[2] == head_dim,
           f"query must be [T, num_heads, {head_dim}], got {tuple(query.shape)}")
    _check(query.shape[1] % num_kv_heads == 0,
           f"{query.shape[1]} query heads are not a multiple of {num_kv_heads} KV heads")
    _check(query.dtype in _DTYPES, f"query dtype must be one of {_DTYPES}")
    _check(query.dtype == key_cache.dtype or key_cache.dtype in _FP8_DTYPES,
           f"query dtype {query.dtype} != cache {key_cache.dtype}")
    _check(query.stride(2) == 1, "query must have a unit stride on head_dim")
    _check(query.device == key_cache.device, "query is not on the cache's device")
    _check(seq_lens.dtype == torch.int32 and seq_lens.dim() == 1, "seq_lens must be int32 [B]")
    _check(block_tables.dtype == torch.int32 and block_tables.dim() == 2
           and block_tables.shape[0] == seq_lens.shape[0] and block_tables.stride(1) == 1,
           "block_tables must be int32 [B, max_blocks] with unit stride on blocks")
    _check(block_n >= 16 and block_n & (block_n - 1) == 0,
           f"block_n must be a power of two >= 16, got {block_n}")
    return query.shape[1] // num_kv_heads


def _check_cache(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    _check(key_cache.dim() == 4, "caches must be [num_blocks, block_size, num_kv_heads, head_dim]")
    _check(key_cache.shape == value_cache.shape and key_cache.dtype == value_cache.dtype,
           "key and value caches must have the same shape and dtype")
    _check(key_cache.is_contiguous() and value_cache.is_contiguous(), "caches must be contiguous")
    _check(key_cache.dtype in _DTYPES + _FP8_DTYPES,
           f"cache dtype must be one of {_DTYPES + _FP8_DTYPES}")


def _check_scales(key_cache: torch.Tensor, *params: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """The scale and offset tensors to launch with: each float32, contiguous, [kv_heads,
    head_dim] on the cache's device, given all or none, and only for an FP8 cache (none:
    the cache itself stands in for each pointer, never read)."""
    if all(p is None for p in params):
        return (key_cache,) * len(params)
    _check(all(p is not None for p in params), "give every scale and offset, or none")
    _check(key_cache.dtype in _FP8_DTYPES, "scales and offsets need an FP8 cache")
    shape = tuple(key_cache.shape[2:])
    for p in params:
        assert p is not None
        _check(p.dtype == torch.float32 and tuple(p.shape) == shape and p.is_contiguous()
               and p.device == key_cache.device,
               f"scales and offsets must be contiguous float32 {list(shape)} on the cache's device")
    return params  # type: ignore[return-value]


def _precision(dtype: torch.dtype) -> str:
    """Full fp32 products for fp32 inputs (no silent TF32); native for 16-bit types."""
    return "ieee" if dtype == torch.float32 else "tf32"


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"triton paged attention: {message}")
