"""The fused ops' torch forms are bit for bit the model's arithmetic, and the CPU dispatch
runs exactly them (no Triton anywhere)."""

from __future__ import annotations

import subprocess
import sys

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from harness.procs import REPO_ROOT
from workers.fused import ops, reference

DTYPES = st.sampled_from([torch.float32, torch.bfloat16])
EPS = st.sampled_from([1e-5, 1e-6])


def llama_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm, as the model's RMSNorm module computes it."""
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rotate_half_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos) + (rotated * sin)


def rand(seed: int, *shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def rope_tables(num_tokens: int, head_dim: int, dtype: torch.dtype):
    positions = torch.arange(num_tokens, dtype=torch.float32) * 13
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    emb = torch.cat([positions[:, None] * inv_freq[None, :]] * 2, dim=-1)
    return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 48), DTYPES, EPS, st.integers(0, 2**16))
def test_norms_are_the_model_formula(tokens, hidden, dtype, eps, seed):
    x, residual = rand(seed, 2, tokens, hidden, dtype=dtype)
    weight = rand(seed + 1, hidden, dtype=dtype)
    x_before, residual_before = x.clone(), residual.clone()
    assert torch.equal(reference.rms_norm(x, weight, eps), llama_rms_norm(x, weight, eps))
    normed, summed = reference.add_rms_norm(x, residual, weight, eps)
    assert torch.equal(summed, residual + x)
    assert torch.equal(normed, llama_rms_norm(residual + x, weight, eps))
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)
    # The CPU dispatch is the reference, exactly.
    assert torch.equal(ops.rms_norm(x, weight, eps), reference.rms_norm(x, weight, eps))
    ops_normed, ops_summed = ops.add_rms_norm(x, residual, weight, eps)
    assert torch.equal(ops_normed, normed) and torch.equal(ops_summed, summed)
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 5), st.integers(1, 4), st.integers(1, 2), st.sampled_from([8, 16, 24, 64]),
    DTYPES, st.booleans(), st.integers(0, 2**16),
)
def test_rotary_is_transformers_rotary(tokens, group, kv_heads, head_dim, dtype, fused, seed):
    heads = group * kv_heads
    if fused:  # views into one QKV projection output, as the model makes them
        qkv = rand(seed, tokens, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
        query = qkv[:, : heads * head_dim].view(tokens, heads, head_dim)
        key = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(tokens, kv_heads, head_dim)
    else:
        query = rand(seed, tokens, heads, head_dim, dtype=dtype)
        key = rand(seed + 1, tokens, kv_heads, head_dim, dtype=dtype)
    cos, sin = rope_tables(tokens, head_dim, dtype)
    query_before, key_before = query.clone(), key.clone()
    got_q, got_k = reference.rotary(query, key, cos, sin)
    hf_q, hf_k = apply_rotary_pos_emb(query, key, cos[:, 0], sin[:, 0], unsqueeze_dim=1)
    assert torch.equal(got_q, hf_q) and torch.equal(got_k, hf_k)
    assert torch.equal(got_q, rotate_half_rope(query, cos, sin))
    assert torch.equal(got_k, rotate_half_rope(key, cos, sin))
    ops_q, ops_k = ops.rotary(query, key, cos, sin)
    assert torch.equal(ops_q, got_q) and torch.equal(ops_k, got_k)
    assert torch.equal(query, query_before) and torch.equal(key, key_before)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 96), DTYPES, st.booleans(), st.integers(0, 2**16))
def test_silu_and_mul_is_the_mlp_formula(tokens, inner, dtype, fused, seed):
    if fused:  # the halves of one gate_up output
        gate_up = rand(seed, tokens, 2 * inner, dtype=dtype) * 4
        gate, up = gate_up[:, :inner], gate_up[:, inner:]
    else:
        gate, up = rand(seed, 2, tokens, inner, dtype=dtype) * 4
    want = F.silu(gate) * up
    assert torch.equal(reference.silu_and_mul(gate, up), want)
    assert torch.equal(ops.silu_and_mul(gate, up), want)


def test_cpu_dispatch_never_imports_triton():
    code = (
        "import sys, torch\n"
        "from workers.fused import ops\n"
        "x = torch.randn(2, 8)\n"
        "ops.rms_norm(x, torch.ones(8), 1e-6)\n"
        "ops.add_rms_norm(x, x.clone(), torch.ones(8), 1e-6)\n"
        "ops.silu_and_mul(x, x)\n"
        "t = torch.ones(2, 1, 8)\n"
        "ops.rotary(torch.randn(2, 2, 8), torch.randn(2, 1, 8), t, t)\n"
        "assert 'triton' not in sys.modules, 'triton was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
