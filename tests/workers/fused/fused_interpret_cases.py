"""Fused Triton kernels vs the torch reference on CPU tensors; run only under TRITON_INTERPRET=1.

Run as a module (``python -m``, from the repository root) in a subprocess by
test_fused_interpret.py, so the interpreter mode (fixed when a ``@triton.jit`` function
is defined) never leaks into the rest of the suite. Prints one JSON object: case name ->
max abs error (float32, against the reference run on the same inputs), or the error text.

Inputs are bounded (clamped normals) so every output stays below 4 in magnitude; the
16-bit tolerances of test_fused_interpret.py are counted in ulps at that scale.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from tests.support.triton_interpreter import Cases
from workers.fused import reference, triton_kernels

assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"

CASES = Cases()
case = CASES.case
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}



def bounded(generator: torch.Generator, *shape: int, limit: float = 2.5) -> torch.Tensor:
    return torch.randn(*shape, generator=generator).clamp(-limit, limit)


def error(got: torch.Tensor, want: torch.Tensor) -> float:
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape)
    assert want.float().abs().max().item() < 4, "outputs must stay below 4 (see the tolerances)"
    return (got.float() - want.float()).abs().max().item()


def norm_inputs(dtype: torch.dtype, n: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    x, residual = bounded(generator, 2, 7, n, limit=1.9).to(dtype)
    weight = (0.5 + 0.5 * torch.rand(n, generator=generator)).to(dtype)
    return x, residual, weight


def rms_norm_error(dtype: torch.dtype, n: int) -> float:
    x, _, weight = norm_inputs(dtype, n, seed=n)
    before = x.clone()
    got = triton_kernels.rms_norm(x, weight, 1e-6)
    assert torch.equal(x, before), "rms_norm modified its input"
    return error(got, reference.rms_norm(x, weight, 1e-6))


def add_rms_norm_error(dtype: torch.dtype, n: int, output: str) -> float:
    """Error of one output (``normed`` or ``summed``); also checks the writes are in place."""
    x, residual, weight = norm_inputs(dtype, n, seed=n + 1)
    want_normed, want_summed = reference.add_rms_norm(x, residual, weight, 1e-5)
    x_ptr, residual_ptr = x.data_ptr(), residual.data_ptr()
    normed, summed = triton_kernels.add_rms_norm(x, residual, weight, 1e-5)
    assert normed is x and summed is residual, "add_rms_norm must return its inputs"
    assert (x.data_ptr(), residual.data_ptr()) == (x_ptr, residual_ptr), "storage moved"
    return error(normed, want_normed) if output == "normed" else error(summed, want_summed)


def rope_tables(num_tokens: int, head_dim: int, dtype: torch.dtype):
    """cos/sin [T, 1, D] as RotaryEmbedding lays them out (rotate-half, positions 0, 7, ...)."""
    positions = torch.arange(num_tokens, dtype=torch.float32) * 7
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, head_dim, 2).float() / head_dim))
    freqs = positions[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


def rotary_error(dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int, fused: bool) -> float:
    """Error over query and key. ``fused``: both are strided views into one
    [T, (H + 2 KV) * D] QKV output, whose V part must come out untouched."""
    generator = torch.Generator().manual_seed(heads * 100 + head_dim)
    num_tokens = 5
    if fused:
        qkv = bounded(generator, num_tokens, (heads + 2 * kv_heads) * head_dim).to(dtype)
        query = qkv[:, : heads * head_dim].view(num_tokens, heads, head_dim)
        key = qkv[:, heads * head_dim : (heads + kv_heads) * head_dim].view(
            num_tokens, kv_heads, head_dim
        )
        value_before = qkv[:, (heads + kv_heads) * head_dim :].clone()
    else:
        query = bounded(generator, num_tokens, heads, head_dim).to(dtype)
        key = bounded(generator, num_tokens, kv_heads, head_dim).to(dtype)
    cos, sin = rope_tables(num_tokens, head_dim, dtype)
    want_q, want_k = reference.rotary(query, key, cos, sin)
    got_q, got_k = triton_kernels.rotary(query, key, cos, sin)
    assert got_q is query and got_k is key, "rotary must rotate in place"
    if fused:
        assert torch.equal(qkv[:, (heads + kv_heads) * head_dim :], value_before), "V was written"
    return max(error(got_q, want_q), error(got_k, want_k))


def silu_error(dtype: torch.dtype, n: int, fused: bool) -> float:
    """``fused``: gate and up are the halves of one [T, 2N] gate_up output."""
    generator = torch.Generator().manual_seed(n)
    if fused:
        gate_up = bounded(generator, 3, 2 * n, limit=2.0).to(dtype)
        gate, up = gate_up[:, :n], gate_up[:, n:]
    else:
        gate, up = bounded(generator, 2, 3, n, limit=2.0).to(dtype)
    return error(triton_kernels.silu_and_mul(gate, up), reference.silu_and_mul(gate, up))


for dt_name, dt in DTYPES.items():
    for n in (24, 40, 2048):
        case(f"rms_norm-{dt_name}-n{n}")(lambda dt=dt, n=n: rms_norm_error(dt, n))
        for out in ("normed", "summed"):
            case(f"add_rms_norm-{dt_name}-n{n}-{out}")(
                lambda dt=dt, n=n, out=out: add_rms_norm_error(dt, n, out)
            )
    for h, kv, d, fused in ((3, 1, 16, True), (4, 2, 24, True), (2, 2, 64, False)):
        layout = "qkv-views" if fused else "contiguous"
        case(f"rotary-{dt_name}-h{h}-kv{kv}-d{d}-{layout}")(
            lambda dt=dt, h=h, kv=kv, d=d, f=fused: rotary_error(dt, h, kv, d, f)
        )
    for n, fused in ((24, False), (40, True), (5632, True)):
        layout = "gate-up-views" if fused else "contiguous"
        case(f"silu_and_mul-{dt_name}-n{n}-{layout}")(
            lambda dt=dt, n=n, f=fused: silu_error(dt, n, f)
        )


@case("rejects-bad-arguments")
def rejects() -> float | str:
    """0.0 when every bad call raises the wrappers' ValueError, else the calls that did not."""
    x, residual, weight = norm_inputs(torch.float32, 24, seed=0)
    query, key = torch.zeros(2, 4, 16), torch.zeros(2, 2, 16)
    cos, sin = rope_tables(2, 16, torch.float32)
    bad: dict[str, Callable[[], object]] = {
        "rms_norm 3-d x": lambda: triton_kernels.rms_norm(x[None], weight, 1e-6),
        "rms_norm weight size": lambda: triton_kernels.rms_norm(x, weight[:20], 1e-6),
        "rms_norm float64": lambda: triton_kernels.rms_norm(x.double(), weight.double(), 1e-6),
        "rms_norm weight dtype": lambda: triton_kernels.rms_norm(x, weight.half(), 1e-6),
        "rms_norm column stride": lambda: triton_kernels.rms_norm(x.t(), weight[:7], 1e-6),
        "add_rms_norm shapes": lambda: triton_kernels.add_rms_norm(x, residual[:1], weight, 1e-6),
        "add_rms_norm aliased": lambda: triton_kernels.add_rms_norm(x, x, weight, 1e-6),
        "rotary head_dim": lambda: triton_kernels.rotary(query, key[..., :8], cos, sin),
        "rotary odd head_dim": lambda: triton_kernels.rotary(
            query[..., :15], key[..., :15], cos[..., :15].contiguous(), sin[..., :15].contiguous()
        ),
        "rotary cos shape": lambda: triton_kernels.rotary(query, key, cos[:, 0], sin),
        "rotary cos dtype": lambda: triton_kernels.rotary(query, key, cos.half(), sin),
        "rotary key dtype": lambda: triton_kernels.rotary(query, key.bfloat16(), cos, sin),
        "rotary strided dim": lambda: triton_kernels.rotary(query.transpose(1, 2), key, cos, sin),
        "silu shapes": lambda: triton_kernels.silu_and_mul(x, residual[:, :12]),
        "silu dtype": lambda: triton_kernels.silu_and_mul(x, residual.bfloat16()),
        "silu int": lambda: triton_kernels.silu_and_mul(x.long(), residual.long()),
        "silu column stride": lambda: triton_kernels.silu_and_mul(x[:, ::2], residual[:, ::2]),
    }
    missed = []
    for name, call in bad.items():
        try:
            call()
        except ValueError as exc:
            if not str(exc).startswith("triton fused: "):
                missed.append(f"{name} ({exc})")
        else:
            missed.append(name)
    return 0.0 if not missed else "not rejected: " + ", ".join(missed)


if __name__ == "__main__":
    CASES.report()
