"""Capacity planning: the 7B shape, dtypes, the safety margin, byte parsing, the CLI."""

from __future__ import annotations

import pytest

from radix.config_flags import parse_bytes
from workers.kv.plan import DEFAULT_SAFETY_MARGIN, gpu_kv_budget, main, plan_kv_cache
from workers.kv.spec import KVCacheSpec

GIB = 2**30


def test_7b_shape_gives_128_kib_per_token_and_131072_tokens_before_the_margin():
    spec = KVCacheSpec(num_layers=32, num_kv_heads=8, head_dim=128, dtype="bf16")
    plan = plan_kv_cache(spec, 16 * GIB)
    assert spec.kv_bytes_per_token == 128 * 1024
    assert spec.kv_bytes_per_block == 2 * 2**20
    assert plan.num_tokens_before_margin == 131_072
    # 2% margin: floor(16 GiB x 0.98 / 2 MiB) = 8028 blocks.
    assert DEFAULT_SAFETY_MARGIN == 0.02
    assert plan.num_blocks == 8028
    assert plan.num_tokens == 8028 * 16 == 128_448
    assert plan.num_sequences(4096) == 31
    assert plan_kv_cache(spec, 16 * GIB, safety_margin=0.0).num_tokens == 131_072


@pytest.mark.parametrize(
    ("dtype", "canonical", "per_token"),
    [
        ("fp16", "float16", 131_072),
        ("bf16", "bfloat16", 131_072),
        ("fp8", "float8_e4m3fn", 65_536),
        ("float32", "float32", 262_144),
    ],
)
def test_dtypes(dtype, canonical, per_token):
    spec = KVCacheSpec(32, 8, 128, dtype)
    assert spec.dtype == canonical
    assert spec.kv_bytes_per_token == per_token


def test_invalid_specs_name_the_field():
    with pytest.raises(ValueError, match="dtype"):
        KVCacheSpec(32, 8, 128, "int4")
    with pytest.raises(ValueError, match="num_kv_heads"):
        KVCacheSpec(32, 0, 128)
    with pytest.raises(ValueError, match="holds no block"):
        plan_kv_cache(KVCacheSpec(32, 8, 128), 1024)


def test_num_sequences_counts_whole_blocks():
    spec = KVCacheSpec(1, 1, 8, "float32", block_size=16)  # 64 B/token, 1 KiB/block
    plan = plan_kv_cache(spec, 1024 * 100 + 1023, safety_margin=0)
    assert plan.num_blocks == 100
    assert plan.num_sequences(16) == 100
    assert plan.num_sequences(17) == 50


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16GiB", 16 * GIB),
        ("16 GiB", 16 * GIB),
        ("500MB", 500 * 10**6),
        ("1048576", 2**20),
        ("1.5KiB", 1536),
        ("2tib", 2 * 2**40),
    ],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


def test_parse_bytes_rejects_garbage():
    with pytest.raises(ValueError):
        parse_bytes("16 gigs")


def test_cli_prints_the_plan_for_each_dtype(capsys):
    argv = ["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--dtype", "bf16"]
    plans = main([*argv, "--kv-cache-bytes", "16GiB", "--seq-len", "4096"])
    out = capsys.readouterr().out
    assert "131,072 B/token (128.0 KiB)" in out
    assert "131,072 tokens before the 2% margin" in out
    assert list(plans) == ["bfloat16", "float16", "float8_e4m3fn"]
    assert plans["float8_e4m3fn"].num_blocks == 2 * plans["bfloat16"].num_blocks
    assert "float8_e4m3fn" in out and "seqs@4096" in out


def test_gpu_budget_is_the_fraction_of_total_less_weights_and_peak_activation():
    # An H200-sized GPU at 0.9: 0.9 x 140 GiB - 16 GiB of weights - 2 GiB of activation.
    budget = gpu_kv_budget(140 * GIB, 0.9, 16 * GIB, 2 * GIB)
    assert budget == int(140 * GIB * 0.9) - 18 * GIB
    spec = KVCacheSpec(num_layers=32, num_kv_heads=8, head_dim=128, dtype="bf16")
    plan = plan_kv_cache(spec, budget, sizing_rule="gpu_memory_utilization 0.9")
    assert plan.num_blocks == int(budget * (1 - DEFAULT_SAFETY_MARGIN)) // (2 * 2**20) == 54_190
    assert plan.sizing_rule == "gpu_memory_utilization 0.9"
    assert plan_kv_cache(spec, 16 * GIB).sizing_rule == "kv_cache_bytes"


@pytest.mark.parametrize(
    ("total", "fraction", "weights", "peak", "message"),
    [(80 * GIB, 0.2, 14 * GIB, 2 * GIB, "leaves no KV memory"),
     (80 * GIB, 0.0, 0, 0, r"must be in \(0, 1\]"),
     (80 * GIB, 1.5, 0, 0, r"must be in \(0, 1\]"),
     (80 * GIB, 0.9, -1, 0, "negative")],
)
def test_gpu_budget_refuses_what_leaves_nothing(total, fraction, weights, peak, message):
    with pytest.raises(ValueError, match=message):
        gpu_kv_budget(total, fraction, weights, peak)
