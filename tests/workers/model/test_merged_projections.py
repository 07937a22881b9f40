"""q/k/v and gate/up merged into one GEMM each (what the loader does on CUDA), checked
on the CPU against the separate projections: same logits up to rounding, same greedy
tokens, with and without LoRA adapters, and the parameters unchanged in name, value
and memory."""

from __future__ import annotations

import pytest
import torch

from tests.workers.model.hf_checkpoints import new_caches, write_hf_checkpoint
from workers.lora.peft_files import BaseShapes
from workers.lora.weights import LoraWeights
from workers.model.loader import load_model
from workers.model.runner import ModelRunner
from workers.model.step_input import StepInput


@pytest.fixture(scope="module", params=["llama-gqa", "llama-bias", "qwen2-bias-tied"])
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    write_hf_checkpoint(path, request.param)
    return path


def adapters(model) -> LoraWeights:
    """Two random adapter slots on every projection."""
    config = model.config
    shapes = BaseShapes.llama(config.num_hidden_layers, config.hidden_size,
                              config.intermediate_size, config.num_attention_heads,
                              config.num_key_value_heads, config.head_dim, 4)
    weights = LoraWeights(shapes, 2, 4, torch.float32, "cpu")
    generator = torch.Generator().manual_seed(5)
    for (layer, module), tensor in weights.lora_a.items():
        tensor.normal_(0, 0.3, generator=generator)
        for slot in range(2):
            out_features = weights.lora_b[layer, module].shape[1]
            b = torch.randn(out_features, 4, generator=generator) * 0.3
            weights.lora_b[layer, module][slot].copy_(b)
            weights.lora_b_stacked[layer, module][slot * 4 : slot * 4 + 4].copy_(b.T)
    weights.scales.fill_(0.5)
    return weights


def logits_of_steps(model, lora: LoraWeights | None) -> list[torch.Tensor]:
    """A mixed prefill, then decode steps, with rows under slot 0, no adapter, slot 1."""
    slots = [0, None, 1] if lora is not None else [None] * 3
    runner = ModelRunner(model, *new_caches(model, 16, 16), 16, lora=lora)
    prompts = [[(5 * row + 3 * i) % 250 + 1 for i in range(9 + 4 * row)] for row in range(3)]
    tables = [[row * 4 + k for k in range(4)] for row in range(3)]
    out = [runner.execute([StepInput(p, 0, t, s) for p, t, s in zip(prompts, tables, slots,
                                                                      strict=True)])]
    lengths = [len(p) for p in prompts]
    for _ in range(5):
        tokens = out[-1].argmax(-1).tolist()
        out.append(runner.execute([StepInput([token], length, table, slot) for token, length,
                                   table, slot in zip(tokens, lengths, tables, slots,
                                                      strict=True)]))
        lengths = [length + 1 for length in lengths]
    return out


@pytest.mark.parametrize("with_adapters", [False, True])
def test_merged_projections_give_the_separate_ones_logits(checkpoint, with_adapters):
    separate = load_model(checkpoint).model
    merged = load_model(checkpoint).model
    merged.merge_projections()
    want = logits_of_steps(separate, adapters(separate) if with_adapters else None)
    got = logits_of_steps(merged, adapters(merged) if with_adapters else None)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
        assert a.argmax(-1).tolist() == b.argmax(-1).tolist()


def test_the_parameters_keep_names_values_and_memory(checkpoint):
    separate = load_model(checkpoint).model
    merged = load_model(checkpoint).model
    merged.merge_projections()
    merged.merge_projections()  # idempotent
    before, after = separate.state_dict(), merged.state_dict()
    assert list(before) == list(after)
    assert all(torch.equal(before[name], after[name]) for name in before)
    attention = merged.model.layers[0].self_attn
    assert attention.qkv is not None
    storage = attention.qkv.weight.untyped_storage().data_ptr()
    for name in ("q_proj", "k_proj", "v_proj"):
        assert getattr(attention, name).weight.untyped_storage().data_ptr() == storage
    mlp = merged.model.layers[0].mlp
    assert mlp.gate_up is not None and mlp.up_proj.weight.data_ptr() == (
        mlp.gate_up.weight[mlp.gate_proj.out_features :].data_ptr())
