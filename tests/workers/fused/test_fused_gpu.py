"""The fused Triton kernels on a real GPU, at a Llama-1B's sizes, against the reference."""

from __future__ import annotations

import pytest
import torch

from tests.support.gpu import ON_GPU
from workers.fused import reference

pytestmark = ON_GPU
# One ulp of the dtype at the outputs' magnitude (below 4) on hardware that rounds to
# nearest; fp32 differs only in summation order.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3.2e-2}


def kernels():
    from workers.fused import triton_kernels

    return triton_kernels


@pytest.mark.parametrize("dtype", list(TOLERANCE))
@pytest.mark.parametrize("tokens", [1, 7, 300])
def test_norms_rotary_and_swiglu_match_the_reference(dtype, tokens):
    generator = torch.Generator(device="cuda").manual_seed(tokens)

    def rand(*shape: int) -> torch.Tensor:
        return torch.rand(shape, generator=generator, device="cuda").sub(0.5).to(dtype)

    x, residual, weight = rand(tokens, 2048), rand(tokens, 2048), rand(2048)
    want_normed, want_summed = reference.add_rms_norm(x, residual, weight, 1e-5)
    got_normed, got_summed = kernels().add_rms_norm(x.clone(), residual.clone(), weight, 1e-5)
    assert (got_normed.float() - want_normed.float()).abs().max() <= TOLERANCE[dtype]
    assert (got_summed.float() - want_summed.float()).abs().max() <= TOLERANCE[dtype]

    qkv = rand(tokens, (32 + 16) * 128)
    query, key = qkv[:, :4096].view(tokens, 32, 128), qkv[:, 4096:5120].view(tokens, 8, 128)
    angles = torch.rand(tokens, 1, 64, generator=generator, device="cuda") * 6.3
    cos, sin = (torch.cat((f(angles), f(angles)), -1).to(dtype) for f in (torch.cos, torch.sin))
    want_q, want_k = reference.rotary(query, key, cos, sin)
    got_q, got_k = kernels().rotary(query.clone(), key.clone(), cos, sin)
    assert (got_q.float() - want_q.float()).abs().max() <= TOLERANCE[dtype]
    assert (got_k.float() - want_k.float()).abs().max() <= TOLERANCE[dtype]

    gate_up = rand(tokens, 2 * 8192) * 4  # silu(2) * 2 stays below 4
    gate, up = gate_up[:, :8192], gate_up[:, 8192:]
    want = reference.silu_and_mul(gate, up)
    assert (kernels().silu_and_mul(gate, up).float() - want.float()).abs().max() <= TOLERANCE[dtype]
