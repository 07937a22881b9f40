"""Torch reference paged attention: gather K/V through block tables, then plain SDPA.

Layout (see docs/model.md): each layer's cache is ``[num_blocks, block_size,
num_kv_heads, head_dim]``; queries and outputs are ``[num_tokens, num_heads,
head_dim]`` with the batch's new tokens flattened back to back (``query_start_loc``).
The K/V of the new tokens must already be in the cache (``write_kv``) before
attention runs, so the "causal part" of a prefill is read from the cache like the
prefix. These functions are the oracle for the Triton kernels and the CPU path.

FP8 caches: ``write_kv`` stores ``(k - o_k) / s_k`` and ``v / s_v`` saturated to the
format's range, with a scale per KV head and channel and a K offset per channel
(``[num_kv_heads, head_dim]`` float32 tensors, ``workers.kv.scales``; None: scale 1,
offset 0), and attention reads the stored values exactly (every FP8 value is a bf16,
fp16 and fp32 value). Neither adds a pass over the keys: with ``k = k_hat * s_k +
o_k``, ``q . k = (q * s_k) . k_hat + q . o_k`` and the last term is the same for every
key of one query, which softmax ignores, so the query is multiplied by ``s_k`` once
and ``o_k`` is never read back; ``sum p (v_hat * s_v) = (sum p v_hat) * s_v`` is
applied to the output once. Caches in the model's dtype take no scales.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def write_kv(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    k_offset: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Store ``key``/``value`` [T, num_kv_heads, head_dim] into cache slots ``slot_mapping``
    [T], quantized with their scales (and the K offsets) when the cache is FP8. A
    negative slot (a padding row of a decode graph bucket) stores nothing."""
    num_kv_heads, head_dim = key_cache.shape[2:]
    if bool((slot_mapping < 0).any()):
        keep = slot_mapping >= 0
        key, value, slot_mapping = key[keep], value[keep], slot_mapping[keep]
    key_cache.view(-1, num_kv_heads, head_dim)[slot_mapping] = quantize(
        key, key_cache.dtype, k_scale, k_offset)
    value_cache.view(-1, num_kv_heads, head_dim)[slot_mapping] = quantize(
        value, value_cache.dtype, v_scale)


def quantize(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor | None = None,
             offset: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` [T, num_kv_heads, head_dim] as stored in a ``dtype`` cache: ``(x - offset) /
    scale`` saturated for FP8 (computed in float32; ``scale`` and ``offset``
    [num_kv_heads, head_dim], None: 1 and 0), else ``x`` cast."""
    if dtype not in FP8_DTYPES:
        return x.to(dtype)
    top = torch.finfo(dtype).max
    x = x.to(torch.float32)
    if offset is not None:
        x = x - offset
    if scale is not None:
        x = x / scale
    return x.clamp_(-top, top).to(dtype)


def paged_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query per sequence ([B, H, D]) attending to all ``seq_lens[b]`` cached tokens."""
    query_start_loc = torch.arange(query.shape[0] + 1, dtype=torch.int32, device=query.device)
    return paged_prefill(
        query, key_cache, value_cache, query_start_loc, seq_lens, block_tables, 1, scale,
        k_scale, v_scale,
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
) -> torch.Tensor:
    """New tokens of each sequence attend to its cached prefix and causally to each other.

    Query ``j`` of sequence ``b`` sits at position ``seq_lens[b] - query_len[b] + j``
    and sees keys at positions ``<=`` its own. Returns ``[T, H, D]`` in query's dtype.
    In a mixed batch the one-token rows (decodes) run apart from the prefill rows, so
    they are not padded to the longest prefill chunk. ``k_scale`` and ``v_scale``
    ([num_kv_heads, head_dim]; None: 1) undo an FP8 cache's quantization (module
    docstring).
    """
    group = query.shape[1] // key_cache.shape[2]
    if k_scale is not None:
        query = (query.to(torch.float32) * _per_query_head(k_scale, group)).to(query.dtype)
    out = _paged_prefill(
        query, key_cache, value_cache, query_start_loc, seq_lens, block_tables, max_query_len,
        scale,
    )
    if v_scale is None:
        return out
    return (out.to(torch.float32) * _per_query_head(v_scale, group)).to(out.dtype)


def _per_query_head(per_kv_head: torch.Tensor, group: int) -> torch.Tensor:
    """A [num_kv_heads, head_dim] tensor repeated for each query head of a KV head's
    group ([num_heads, head_dim], as SDPA's grouped-query attention pairs them)."""
    return per_kv_head.repeat_interleave(group, dim=0)


def _paged_prefill(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    max_query_len: int,
    scale: float,
) -> torch.Tensor:
    query_lens = query_start_loc[1:] - query_start_loc[:-1]
    is_decode = query_lens == 1
    if max_query_len > 1 and bool(is_decode.any()):
        return _split_decodes(
            query, key_cache, value_cache, query_start_loc, seq_lens, block_tables, max_query_len,
            scale, is_decode,
        )
    seq_lens = seq_lens.long()
    keys, values, key_pos = _gather(key_cache, value_cache, block_tables, seq_lens, query.dtype)
    if max_query_len == 1:  # one query per sequence, at its last position
        visible = key_pos[None, :] < seq_lens[:, None]
        mask = None if bool(visible.all()) else visible[:, None, None]
        return _attend(query[:, None], keys, values, mask, scale)[:, 0]
    # Scatter the flat queries into [B, max_query_len, H, D].
    num_seqs, device = seq_lens.shape[0], query.device
    query_lens = (query_start_loc[1:] - query_start_loc[:-1]).long()
    seq_index = torch.repeat_interleave(torch.arange(num_seqs, device=device), query_lens)
    offsets = torch.arange(query.shape[0], device=device) - query_start_loc[seq_index].long()
    padded_query = query.new_zeros((num_seqs, max_query_len, *query.shape[1:]))
    padded_query[seq_index, offsets] = query
    query_pos = (seq_lens - query_lens)[:, None] + torch.arange(max_query_len, device=device)
    visible = (key_pos[None, None, :] <= query_pos[:, :, None]) & (
        key_pos[None, None, :] < seq_lens[:, None, None]
    )
    return _attend(padded_query, keys, values, visible[:, None], scale)[seq_index, offsets]


def _split_decodes(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    max_query_len: int,
    scale: float,
    is_decode: torch.Tensor,
) -> torch.Tensor:
    """``paged_prefill`` of a mixed batch as one decode call plus one prefill call."""
    out = torch.empty_like(query)
    decodes = is_decode.nonzero().flatten()
    rows = query_start_loc[decodes].long()
    decode_start_loc = torch.arange(len(decodes) + 1, dtype=torch.int32, device=query.device)
    out[rows] = _paged_prefill(
        query[rows], key_cache, value_cache, decode_start_loc, seq_lens[decodes],
        block_tables[decodes], 1, scale,
    )
    prefills = (~is_decode).nonzero().flatten()
    starts, ends = query_start_loc[prefills].long(), query_start_loc[prefills + 1].long()
    spans = zip(starts.tolist(), ends.tolist(), strict=True)
    token_rows = torch.cat([torch.arange(a, b, device=query.device) for a, b in spans])
    sub_start_loc = torch.zeros(len(prefills) + 1, dtype=query_start_loc.dtype)
    sub_start_loc[1:] = torch.cumsum(ends - starts, 0)
    out[token_rows] = _paged_prefill(
        query[token_rows], key_cache, value_cache, sub_start_loc.to(query.device),
        seq_lens[prefills], block_tables[prefills], max_query_len, scale,
    )
    return out


def _gather(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each sequence's K/V as [B, max(seq_lens), kv_heads, D] in ``dtype``, plus key
    positions (FP8 values convert exactly; their scales are applied by the caller).

    Slots past a shorter sequence's length hold stale data (or uninitialized memory);
    they are zeroed so a masked-out NaN can never reach the output as 0 * NaN.
    """
    block_size = key_cache.shape[1]
    max_len = int(seq_lens.max())
    offsets = torch.arange(block_size, device=key_cache.device)
    slots = (block_tables.long()[:, :, None] * block_size + offsets).flatten(1)[:, :max_len]
    shape = (*slots.shape, *key_cache.shape[2:])
    keys = key_cache.flatten(0, 1).index_select(0, slots.flatten()).view(shape).to(dtype)
    values = value_cache.flatten(0, 1).index_select(0, slots.flatten()).view(shape).to(dtype)
    key_pos = torch.arange(max_len, device=key_cache.device)
    stale = key_pos[None, :] >= seq_lens[:, None]
    if bool(stale.any()):
        keys.masked_fill_(stale[:, :, None, None], 0.0)
        values.masked_fill_(stale[:, :, None, None], 0.0)
    return keys, values, key_pos


def _attend(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    visible: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """SDPA over [B, Q, H, D] queries and [B, L, KV, D] keys/values; ``visible``
    [B, 1, Q, L] (None: every key visible)."""
    out = F.scaled_dot_product_attention(
        query.transpose(1, 2),
        keys.transpose(1, 2),
        values.transpose(1, 2),
        attn_mask=visible,
        scale=scale,
        enable_gqa=query.shape[2] != keys.shape[2],
    )
    return out.transpose(1, 2)
