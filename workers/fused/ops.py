"""Chooses the fused-op implementation by device: Triton on CUDA, torch reference elsewhere.

The decoder calls only these functions, so a layer never knows which path runs. Triton
is imported on first CUDA use: CPU-only installs (and platforms without Triton) never
load it. On the CPU every result is bit for bit the model's torch arithmetic
(``workers.fused.reference``); on CUDA it equals the reference up to floating-point
rounding, and the CUDA path needs row tensors ``[T, N]`` (a unit stride on the last dim).

Callers must treat the inputs of ``add_rms_norm`` (``x``, ``residual``) and ``rotary``
(``query``, ``key``) as consumed: on CUDA they are overwritten in place (on the CPU
they are not), so only the returned tensors may be used afterwards.
"""

from __future__ import annotations

import torch

from workers.fused import reference


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS norm of ``x``'s last dim times ``weight`` (``reference.rms_norm`` up to
    rounding); a new tensor, ``x`` is left as it was."""
    if x.is_cuda:
        from workers.fused import triton_kernels

        return triton_kernels.rms_norm(x, weight, eps)
    return reference.rms_norm(x, weight, eps)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(residual + x), residual + x)`` (``reference.add_rms_norm`` up to
    rounding). On CUDA ``x`` and ``residual`` are overwritten and returned: callers must
    not reuse them."""
    if x.is_cuda:
        from workers.fused import triton_kernels

        return triton_kernels.add_rms_norm(x, residual, weight, eps)
    return reference.add_rms_norm(x, residual, weight, eps)


def rotary(
    query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``query`` [T, H, D] and ``key`` [T, KV, D] rotated by ``cos``/``sin`` [T, 1, D]
    (``reference.rotary`` up to rounding). On CUDA they are rotated in place and
    returned: callers must not reuse the unrotated tensors."""
    if query.is_cuda:
        from workers.fused import triton_kernels

        return triton_kernels.rotary(query, key, cos, sin)
    return reference.rotary(query, key, cos, sin)


def silu_and_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` (``reference.silu_and_mul`` up to rounding); a new tensor."""
    if gate.is_cuda:
        from workers.fused import triton_kernels

        return triton_kernels.silu_and_mul(gate, up)
    return reference.silu_and_mul(gate, up)
