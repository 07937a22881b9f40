"""Triton kernels for the decoder's elementwise ops: (residual add +) RMSNorm, RoPE, SwiGLU.

Same contracts as ``workers.fused.reference`` (the oracle) up to floating-point rounding,
one checked wrapper per kernel; each replaces several torch launches (and temporaries).
Inputs need a unit stride on the last dim only: row tensors ``[T, N]`` and query/key
``[T, heads, head_dim]`` may be views into fused projection outputs (QKV, gate_up).

Choices. The norm kernels run one program per row and hold the whole row in one
power-of-two tile (hidden sizes are a few thousand), so it is read once. The rotary
kernel runs one program per token: it loads the token's cos/sin row once and rotates all
its query heads, then all its key heads, as two ``[heads, head_dim / 2]`` tiles (the
halves that rotate-half pairs), so any even ``head_dim`` works and every element is
written by the thread that read it and its partner (in place needs no barrier). SwiGLU tiles rows by ``BLOCK``, grid ``(T, cdiv(N, BLOCK))``.

Rounding. All arithmetic is on float32 values (16-bit loads are upcast first) and is
rounded to the storage dtype where torch rounds between ops: the residual sum before it
is normalized, the normalized value before the weight multiplies it, silu before the
product with ``up``. The rotation is rounded once (torch rounds each product and the
sum, so 16-bit results may differ by an ulp).

In place: ``add_rms_norm`` overwrites both of its inputs and ``rotary`` overwrites query
and key (the decoder never reads them again), so no output is allocated.

Runs on CUDA, and on CPU tensors under ``TRITON_INTERPRET=1`` (tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, stride_x, stride_r, stride_o, n_cols, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
        summed = (x + r).to(dtype)  # rounded to the storage dtype, as torch's add
        tl.store(residual_ptr + row * stride_r + cols, summed, mask=mask)
        x = summed.to(tl.float32)
    mean_sq = tl.sum(x * x, axis=0) / n_cols
    normed = (x * tl.rsqrt(mean_sq + eps)).to(dtype)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    out = (weight * normed.to(tl.float32)).to(dtype)
    tl.store(out_ptr + row * stride_o + cols, out, mask=mask)


@triton.jit
def _rotate_heads(
    row_ptr, stride_h, cos_1, sin_1, cos_2, sin_2, half_dims, half_ok,
    NUM_HEADS: tl.constexpr, HEADS_P: tl.constexpr, HALF: tl.constexpr,
):
    """Rotate one token's ``NUM_HEADS`` heads at ``row_ptr`` in place.

    Each element and its rotate-half partner are loaded into the same position of two
    tiles of one shape, so the thread that stores an element loaded both of its
    inputs: no thread overwrites what another has yet to read."""
    heads = tl.arange(0, HEADS_P)[:, None]
    mask = (heads < NUM_HEADS) & half_ok[None, :]
    first = row_ptr + heads * stride_h + half_dims[None, :]
    x_1 = tl.load(first, mask=mask, other=0.0).to(tl.float32)
    x_2 = tl.load(first + HALF, mask=mask, other=0.0).to(tl.float32)
    dtype = row_ptr.dtype.element_ty
    tl.store(first, (x_1 * cos_1[None, :] - x_2 * sin_1[None, :]).to(dtype), mask=mask)
    tl.store(first + HALF, (x_2 * cos_2[None, :] + x_1 * sin_2[None, :]).to(dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    query_ptr, key_ptr, cos_ptr, sin_ptr, stride_qt, stride_qh, stride_kt, stride_kh,
    NUM_Q_HEADS: tl.constexpr, NUM_K_HEADS: tl.constexpr, Q_HEADS_P: tl.constexpr,
    K_HEADS_P: tl.constexpr, HEAD_DIM: tl.constexpr, HALF_P: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    half = HEAD_DIM // 2
    half_dims = tl.arange(0, HALF_P)
    half_ok = half_dims < half
    # rotate_half(x) = cat(-x[D/2:], x[:D/2]): the first half takes -x_2 sin, the second +x_1 sin.
    table = token * HEAD_DIM + half_dims
    cos_1 = tl.load(cos_ptr + table, mask=half_ok, other=0.0).to(tl.float32)
    sin_1 = tl.load(sin_ptr + table, mask=half_ok, other=0.0).to(tl.float32)
    cos_2 = tl.load(cos_ptr + table + half, mask=half_ok, other=0.0).to(tl.float32)
    sin_2 = tl.load(sin_ptr + table + half, mask=half_ok, other=0.0).to(tl.float32)
    _rotate_heads(query_ptr + token * stride_qt, stride_qh, cos_1, sin_1, cos_2, sin_2,
                  half_dims, half_ok, NUM_Q_HEADS, Q_HEADS_P, half)
    _rotate_heads(key_ptr + token * stride_kt, stride_kh, cos_1, sin_1, cos_2, sin_2,
                  half_dims, half_ok, NUM_K_HEADS, K_HEADS_P, half)


@triton.jit
def _silu_and_mul_kernel(
    gate_ptr, up_ptr, out_ptr, stride_g, stride_u, stride_o, n_cols, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(gate_ptr + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + row * stride_u + cols, mask=mask, other=0.0).to(tl.float32)
    act = (gate / (1.0 + tl.exp(-gate))).to(dtype)  # F.silu rounds to the dtype
    tl.store(out_ptr + row * stride_o + cols, (act.to(tl.float32) * up).to(dtype), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS norm of ``x`` [T, N] times ``weight`` [N], in a new contiguous tensor;
    ``reference.rms_norm`` up to rounding. ``x`` is not modified."""
    _check_norm(x, weight)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.shape[0] > 0:
        _launch_norm(x, x, weight, out, eps, has_residual=False)
    return out


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference.add_rms_norm`` up to rounding, IN PLACE: both inputs are overwritten.

    ``residual`` [T, N] receives ``residual + x`` (rounded to the dtype) and ``x`` [T, N]
    receives its RMS norm times ``weight``; returns ``(x, residual)``.
    """
    _check_norm(x, weight)
    _check_rows("residual", residual, x)
    _check(x.data_ptr() != residual.data_ptr() or x.numel() == 0,
           "x and residual must not share storage")
    if x.shape[0] > 0:
        _launch_norm(x, residual, weight, x, eps, has_residual=True)
    return x, residual


def rotary(
    query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference.rotary`` up to rounding, IN PLACE, one launch: ``query`` [T, H, D] and
    ``key`` [T, KV, D] are overwritten with their rotations; returns ``(query, key)``."""
    _check(query.dim() == 3 and key.dim() == 3, "query and key must be [T, heads, head_dim]")
    num_tokens, num_heads, head_dim = query.shape
    _check(key.shape[0] == num_tokens and key.shape[2] == head_dim,
           f"key must be [{num_tokens}, kv_heads, {head_dim}], got {tuple(key.shape)}")
    _check(head_dim % 2 == 0, f"head_dim must be even, got {head_dim}")
    _check(query.dtype in _DTYPES, f"dtype must be one of {_DTYPES}, got {query.dtype}")
    _check(query.stride(2) == 1 and key.stride(2) == 1,
           "query and key must have a unit stride on head_dim")
    for name, tensor in (("key", key), ("cos", cos), ("sin", sin)):
        _check(tensor.dtype == query.dtype, f"{name} dtype {tensor.dtype} != query {query.dtype}")
        _check(tensor.device == query.device, f"{name} is not on the query's device")
        _check(name == "key" or (tensor.shape == (num_tokens, 1, head_dim) and tensor.is_contiguous()),
               f"{name} must be contiguous [{num_tokens}, 1, {head_dim}], got {tuple(tensor.shape)}")
    if num_tokens == 0:
        return query, key
    _rotary_kernel[(num_tokens,)](
        query, key, cos, sin, query.stride(0), query.stride(1), key.stride(0), key.stride(1),
        NUM_Q_HEADS=num_heads, NUM_K_HEADS=key.shape[1],
        Q_HEADS_P=triton.next_power_of_2(num_heads), K_HEADS_P=triton.next_power_of_2(key.shape[1]),
        HEAD_DIM=head_dim, HALF_P=triton.next_power_of_2(head_dim // 2),
    )
    return query, key


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate``/``up`` [T, N] in a new contiguous tensor;
    ``reference.silu_and_mul`` up to rounding (both ops round to the dtype, as torch's)."""
    _check_rows("gate", gate, gate)
    _check_rows("up", up, gate)
    _check(block > 0 and block & (block - 1) == 0, f"block must be a power of two, got {block}")
    out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    num_rows, n_cols = gate.shape
    if num_rows == 0 or n_cols == 0:
        return out
    block = min(block, triton.next_power_of_2(n_cols))
    _silu_and_mul_kernel[(num_rows, triton.cdiv(n_cols, block))](
        gate, up, out, gate.stride(0), up.stride(0), out.stride(0), n_cols, BLOCK=block,
        num_warps=_num_warps(block),
    )
    return out


def _launch_norm(x, residual, weight, out, eps: float, has_residual: bool) -> None:
    block = triton.next_power_of_2(x.shape[1])
    _rms_norm_kernel[(x.shape[0],)](
        x, residual, weight, out, x.stride(0), residual.stride(0), out.stride(0), x.shape[1],
        eps, HAS_RESIDUAL=has_residual, BLOCK=block, num_warps=_num_warps(block),
    )


def _check_norm(x: torch.Tensor, weight: torch.Tensor) -> None:
    _check_rows("x", x, x)
    _check(x.shape[1] > 0 and tuple(weight.shape) == (x.shape[1],) and weight.stride(0) == 1,
           f"weight must be contiguous [{x.shape[1]}], got {tuple(weight.shape)}")
    _check(weight.dtype == x.dtype, f"weight dtype {weight.dtype} != x {x.dtype}")
    _check(weight.device == x.device, "weight is not on x's device")


def _check_rows(name: str, tensor: torch.Tensor, like: torch.Tensor) -> None:
    """``tensor`` is a [T, N] row tensor with a unit column stride, matching ``like``."""
    _check(tensor.dim() == 2, f"{name} must be [T, N], got {tuple(tensor.shape)}")
    _check(tensor.dtype in _DTYPES, f"{name} dtype must be one of {_DTYPES}, got {tensor.dtype}")
    _check(tensor.stride(1) == 1, f"{name} must have a unit stride on its last dim")
    _check(tensor.shape == like.shape, f"{name} shape {tuple(tensor.shape)} != {tuple(like.shape)}")
    _check(tensor.dtype == like.dtype, f"{name} dtype {tensor.dtype} != {like.dtype}")
    _check(tensor.device == like.device, f"{name} is not on the same device")


def _num_warps(block: int) -> int:
    """About 256 elements a warp (8 per thread), between 1 and 16 warps."""
    return max(1, min(16, block // 256))


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(f"triton fused: {message}")
