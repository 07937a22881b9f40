"""FP8 KV in the torch reference: store/load round trip, saturation, attention."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tests.workers.attention.paged_cases import dense_attention, make_case
from workers.attention import reference

FORMATS = [(torch.float8_e4m3fn, 3), (torch.float8_e5m2, 2)]


@pytest.mark.parametrize("dtype, mantissa_bits", FORMATS)
def test_store_then_load_round_trip_within_one_fp8_step(dtype, mantissa_bits):
    generator = torch.Generator().manual_seed(0)
    key = torch.randn(7, 2, 8, generator=generator)
    value = torch.randn(7, 2, 8, generator=generator) * 40
    caches = [torch.zeros(4, 4, 2, 8, dtype=dtype) for _ in range(2)]
    slots = torch.tensor([3, 0, 15, 9, 4, 11, 6])
    k_scale, v_scale = 0.01, 0.2
    reference.write_kv(*caches, key, value, slots, k_scale, v_scale)
    for cache, original, scale in ((caches[0], key, k_scale), (caches[1], value, v_scale)):
        loaded = cache.view(-1, 2, 8)[slots].float() * scale
        step = original.abs() * 2.0**-mantissa_bits + torch.finfo(dtype).smallest_normal * scale
        assert bool(((loaded - original).abs() <= step).all())


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_values_beyond_the_range_saturate_instead_of_overflowing(dtype):
    top = torch.finfo(dtype).max
    stored = reference.quantize(torch.tensor([1e9, -1e9, 3.0]), 1.0, dtype).float()
    assert stored.tolist() == [top, -top, 3.0]


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_attention_equals_dense_attention_over_the_dequantized_cache(dtype):
    c = make_case([5, 1, 20], [12, 30, 0], 8, num_heads=4, num_kv_heads=2, head_dim=16)
    k_scale, v_scale = 0.03, 0.007
    key_fp8 = reference.quantize(c.key_cache, k_scale, dtype)
    value_fp8 = reference.quantize(c.value_cache, v_scale, dtype)
    m = c.metadata
    got = reference.paged_prefill(c.query, key_fp8, value_fp8, m.query_start_loc, m.seq_lens,
                                  m.block_tables, m.max_query_len, c.scale, k_scale, v_scale)
    dequantized = replace(
        c, key_cache=key_fp8.float() * k_scale, value_cache=value_fp8.float() * v_scale
    )
    expected = dense_attention(dequantized)
    assert (got.double() - expected).abs().max().item() < 1e-5
    # and close to attention over the unquantized cache
    assert (got.double() - dense_attention(c)).abs().max().item() < 0.25


def test_decode_with_fp8_cache_matches_prefill_path():
    c = make_case([1, 1], [17, 40], 8, seed=2)
    dtype = torch.float8_e4m3fn
    key_fp8 = reference.quantize(c.key_cache, 0.02, dtype)
    value_fp8 = reference.quantize(c.value_cache, 0.02, dtype)
    m = c.metadata
    decode = reference.paged_decode(
        c.query, key_fp8, value_fp8, m.seq_lens, m.block_tables, c.scale, 0.02, 0.02
    )
    prefill = reference.paged_prefill(c.query, key_fp8, value_fp8, m.query_start_loc,
                                      m.seq_lens, m.block_tables, 1, c.scale, 0.02, 0.02)
    assert torch.equal(decode, prefill)
