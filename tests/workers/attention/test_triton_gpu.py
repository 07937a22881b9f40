"""Triton kernels on a real GPU: against the reference, in 16- and 32-bit types."""

from __future__ import annotations

import pytest
import torch

from tests.support.gpu import ON_GPU
from tests.workers.attention.paged_cases import channel_scales, make_case
from workers.attention import reference

pytestmark = ON_GPU
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def kernels():
    from workers.attention import triton_kernels

    return triton_kernels


@pytest.mark.parametrize("dtype", list(TOLERANCE))
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"), [(8, 8, 64), (32, 8, 128), (28, 4, 128)]
)
def test_prefill_and_decode_match_reference(dtype, block_size, num_heads, num_kv_heads, head_dim):
    prefill = make_case([70, 1, 300, 17], [500, 47, 0, 1000], block_size, num_heads, num_kv_heads,
                        head_dim, dtype=dtype, device="cuda")
    m = prefill.metadata
    args = (prefill.query, prefill.key_cache, prefill.value_cache, m.query_start_loc, m.seq_lens,
            m.block_tables, m.max_query_len, prefill.scale)
    error = (kernels().paged_prefill(*args).float() - reference.paged_prefill(*args).float()).abs()
    assert error.max().item() < TOLERANCE[dtype]

    decode = make_case([1] * 6, [0, 15, 16, 333, 2000, 4095], block_size, num_heads, num_kv_heads,
                       head_dim, dtype=dtype, device="cuda")
    m = decode.metadata
    args = (
        decode.query,
        decode.key_cache,
        decode.value_cache,
        m.seq_lens,
        m.block_tables,
        decode.scale,
    )
    expected = reference.paged_decode(*args).float()
    for num_splits in (1, 4, None):
        got = kernels().paged_decode(*args, num_splits=num_splits).float()
        assert (got - expected).abs().max().item() < TOLERANCE[dtype]


def test_store_kv_matches_reference():
    caches = [torch.randn(64, 16, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    fused = torch.randn(100, 3, 8, 128, device="cuda", dtype=torch.bfloat16)
    slots = torch.randperm(64 * 16, device="cuda")[:100]
    ours = [c.clone() for c in caches]
    reference.write_kv(*caches, fused[:, 0], fused[:, 1], slots)
    kernels().store_kv(*ours, fused[:, 0], fused[:, 1], slots)
    assert all(torch.equal(a, b) for a, b in zip(caches, ours, strict=True))


def test_demo_model_generates_the_same_tokens_on_gpu_and_cpu(tmp_path):
    from workers.model.demo import ensure_demo_checkpoint
    from workers.model.loader import load_model
    from workers.model.runner import ModelRunner
    from workers.model.step_input import StepInput

    path = ensure_demo_checkpoint(tmp_path)
    outputs = []
    for device in ("cpu", "cuda"):
        model = load_model(path, device=device).model
        config = model.config
        shape = (32, 16, config.num_key_value_heads, config.head_dim)
        keys = [torch.zeros(shape, device=device) for _ in range(config.num_hidden_layers)]
        values = [torch.zeros(shape, device=device) for _ in range(config.num_hidden_layers)]
        runner = ModelRunner(model, keys, values, 16)
        tokens = list(range(1, 200))
        table = list(range(31, 15, -1))
        logits = runner.execute([StepInput(tokens, 0, table)])
        for _ in range(24):
            tokens.append(int(logits[0].argmax()))
            logits = runner.execute([StepInput(tokens[-1:], len(tokens) - 1, table)])
        outputs.append(tokens)
    assert outputs[0] == outputs[1]


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_store_and_attention_match_reference(fp8):
    k_scale, k_offset, v_scale = channel_scales(8, 128, device="cuda")
    key = (torch.randn(100, 8, 128, device="cuda") * 60 * k_scale + k_offset).bfloat16()
    value = (torch.randn(100, 8, 128, device="cuda") * 60 * v_scale).bfloat16()
    slots = torch.randperm(64 * 16, device="cuda")[:100]
    ref = [torch.zeros(64, 16, 8, 128, device="cuda", dtype=fp8) for _ in range(2)]
    ours = [c.clone() for c in ref]
    reference.write_kv(*ref, key, value, slots, k_scale, k_offset, v_scale)
    kernels().store_kv(*ours, key, value, slots, k_scale, k_offset, v_scale)
    for a, b in zip(ref, ours, strict=True):
        assert torch.equal(a.float(), b.float())
    case = make_case([70, 1, 300], [500, 47, 1000], 16, 32, 8, 128, dtype=torch.bfloat16,
                     device="cuda")
    caches = [reference.quantize(case.key_cache.float() * 60 * k_scale + k_offset, fp8, k_scale,
                                 k_offset),
              reference.quantize(case.value_cache.float() * 60 * v_scale, fp8, v_scale)]
    m = case.metadata
    args = (case.query, *caches, m.query_start_loc, m.seq_lens, m.block_tables,
            m.max_query_len, case.scale, k_scale, v_scale)
    error = (kernels().paged_prefill(*args).float() - reference.paged_prefill(*args).float()).abs()
    assert error.max().item() < TOLERANCE[torch.bfloat16]
