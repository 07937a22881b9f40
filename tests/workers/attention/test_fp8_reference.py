"""FP8 KV in the torch reference: store/load round trip with per-channel scales and K
offsets, saturation, and attention over an FP8 cache equal to dense attention over the
dequantized one (the K offsets, never read back, change nothing: softmax ignores them)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.workers.attention.paged_cases import channel_scales, dense_attention, make_case
from workers.attention import reference

FORMATS = [(torch.float8_e4m3fn, 3), (torch.float8_e5m2, 2)]


@pytest.mark.parametrize("dtype, mantissa_bits", FORMATS)
def test_store_then_load_round_trip_within_one_fp8_step_per_channel(dtype, mantissa_bits):
    generator = torch.Generator().manual_seed(0)
    k_scale, k_offset, v_scale = channel_scales(2, 8, seed=1)
    key = torch.randn(7, 2, 8, generator=generator) * 40 * k_scale + k_offset  # within range
    value = torch.randn(7, 2, 8, generator=generator) * 40 * v_scale
    caches = [torch.zeros(4, 4, 2, 8, dtype=dtype) for _ in range(2)]
    slots = torch.tensor([3, 0, 15, 9, 4, 11, 6])
    reference.write_kv(*caches, key, value, slots, k_scale, k_offset, v_scale)
    for cache, original, scale, offset in ((caches[0], key, k_scale, k_offset),
                                           (caches[1], value, v_scale, 0.0)):
        loaded = cache.view(-1, 2, 8)[slots].float() * scale + offset
        step = ((original - offset).abs() * 2.0**-mantissa_bits
                + torch.finfo(dtype).smallest_normal * scale)
        assert bool(((loaded - original).abs() <= step + 1e-6).all())


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_values_beyond_the_range_saturate_instead_of_overflowing(dtype):
    top = torch.finfo(dtype).max
    stored = reference.quantize(torch.tensor([[[1e9, -1e9, 3.0]]]), dtype).float()
    assert stored.flatten().tolist() == [top, -top, 3.0]
    scale, offset = torch.tensor([[1.0, 1.0, 0.5]]), torch.tensor([[0.0, 0.0, 1.0]])
    stored = reference.quantize(torch.tensor([[[1e9, -1e9, 3.0]]]), dtype, scale, offset)
    assert stored.float().flatten().tolist() == [top, -top, 4.0]


@pytest.mark.parametrize("dtype, mantissa_bits", FORMATS)
def test_fp8_attention_equals_dense_attention_over_the_dequantized_cache(dtype, mantissa_bits):
    base = make_case([5, 1, 20], [12, 30, 0], 8, num_heads=4, num_kv_heads=2, head_dim=16)
    k_scale, k_offset, v_scale = channel_scales(2, 16, seed=3)
    c = replace(base, key_cache=base.key_cache * 40 * k_scale + k_offset,
                value_cache=base.value_cache * 40 * v_scale)
    key_fp8 = reference.quantize(c.key_cache, dtype, k_scale, k_offset)
    value_fp8 = reference.quantize(c.value_cache, dtype, v_scale)
    m = c.metadata
    got = reference.paged_prefill(c.query, key_fp8, value_fp8, m.query_start_loc, m.seq_lens,
                                  m.block_tables, m.max_query_len, c.scale, k_scale, v_scale)
    dequantized = replace(
        c, key_cache=key_fp8.float() * k_scale + k_offset, value_cache=value_fp8.float() * v_scale
    )
    expected = dense_attention(dequantized)
    assert (got.double() - expected).abs().max().item() < 1e-5
    # and close to attention over the unquantized cache
    assert (got.double() - dense_attention(c)).abs().max().item() < 0.4 * 2.0**-mantissa_bits


def test_decode_with_fp8_cache_matches_prefill_path():
    c = make_case([1, 1], [17, 40], 8, seed=2)
    dtype = torch.float8_e4m3fn
    k_scale, k_offset, v_scale = channel_scales(2, 32, seed=4)
    key_fp8 = reference.quantize(c.key_cache, dtype, k_scale, k_offset)
    value_fp8 = reference.quantize(c.value_cache, dtype, v_scale)
    m = c.metadata
    decode = reference.paged_decode(
        c.query, key_fp8, value_fp8, m.seq_lens, m.block_tables, c.scale, k_scale, v_scale
    )
    prefill = reference.paged_prefill(c.query, key_fp8, value_fp8, m.query_start_loc,
                                      m.seq_lens, m.block_tables, 1, c.scale, k_scale, v_scale)
    assert torch.equal(decode, prefill)
