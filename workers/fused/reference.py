"""Torch forms of the fused decoder ops: the oracle of the Triton kernels and the CPU path.

Each function repeats the model's own arithmetic operation for operation (transformers'
``LlamaRMSNorm``, transformers' ``apply_rotary_pos_emb``, ``F.silu(gate) * up``), so the
CPU path stays bit for bit what it was. Nothing here modifies its inputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS norm of the last dimension in float32, cast back to ``x``'s dtype, times
    ``weight``: exactly transformers' ``LlamaRMSNorm``."""
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(residual + x), residual + x)``, the sum in the tensors' dtype.

    The inputs are left as they were (new tensors are returned).
    """
    summed = residual + x
    return rms_norm(summed, weight, eps), summed


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate heads ``x`` [T, heads, head_dim] by the tables of
    ``workers.model.rope.RotaryEmbedding`` (rotate-half layout)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos) + (rotated * sin)


def rotary(
    query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``query`` [T, H, D] and ``key`` [T, KV, D] rotated by ``cos``/``sin`` [T, 1, D]
    (rotate-half layout) exactly as ``apply_rotary`` does; new tensors."""
    return apply_rotary(query, cos, sin), apply_rotary(key, cos, sin)


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's inner product ``silu(gate) * up``, exactly as the MLP computes it."""
    return F.silu(gate) * up
