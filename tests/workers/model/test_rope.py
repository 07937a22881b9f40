"""RoPE frequencies equal transformers' ROPE_INIT_FUNCTIONS bit for bit."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from workers.fused.reference import apply_rotary
from workers.model.config import ModelConfig
from workers.model.rope import RotaryEmbedding, dynamic_ntk_inv_freq, inverse_frequencies

SCALINGS = [
    None,
    {"rope_type": "linear", "factor": 3.0},
    {"rope_type": "dynamic", "factor": 2.0},
    {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 512,
    },
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512, "mscale": 1.0,
     "mscale_all_dim": 0.5, "beta_fast": 16, "truncate": False},
]


def configs(scaling):
    kwargs = {
        "hidden_size": 256,
        "num_attention_heads": 4,
        "head_dim": 64,
        "max_position_embeddings": 2048,
        "rope_theta": 500000.0,
        "rope_scaling": scaling,
    }
    hf = LlamaConfig(**kwargs)
    return hf, ModelConfig.from_dict({**hf.to_dict(), "architectures": ["LlamaForCausalLM"]})


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s and s["rope_type"])
def test_inverse_frequencies_match_transformers(scaling):
    hf, ours = configs(scaling)
    inv_freq, attention_scaling = inverse_frequencies(ours)
    if scaling is None:
        expected, expected_scaling = (
            1.0 / (500000.0 ** (torch.arange(0, 64, 2, dtype=torch.float) / 64)),
            1.0,
        )
    else:
        expected, expected_scaling = ROPE_INIT_FUNCTIONS[scaling["rope_type"]](hf, "cpu")
    assert torch.equal(inv_freq, expected)
    assert attention_scaling == expected_scaling


def test_dynamic_frequencies_past_max_positions_match_transformers():
    hf, ours = configs({"rope_type": "dynamic", "factor": 2.0})
    for seq_len in (2049, 3000, 10000):
        expected, _ = ROPE_INIT_FUNCTIONS["dynamic"](hf, "cpu", seq_len=torch.tensor(seq_len))
        ours_freq = dynamic_ntk_inv_freq(ours, torch.tensor([seq_len]))[0]
        assert torch.equal(ours_freq, expected)


def test_dynamic_rotation_is_a_function_of_position_only():
    _, config = configs({"rope_type": "dynamic", "factor": 2.0})
    rope = RotaryEmbedding(config)
    heads = torch.randn(1, 4, 64).expand(3, 4, 64)
    positions = (10, 2500, 4000)
    together = apply_rotary(heads, *rope(torch.tensor(positions), torch.float32))
    for row, position in enumerate(positions):
        alone = apply_rotary(heads[:1], *rope(torch.tensor([position]), torch.float32))
        assert torch.equal(together[row], alone[0])
