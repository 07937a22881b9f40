"""ModelConfig parsing: both config.json dialects, defaults, and errors naming the field."""

from __future__ import annotations

import json

import pytest
import torch

from workers.model.config import ModelConfig, RopeScaling

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}


def parse(**overrides):
    return ModelConfig.from_dict({**BASE, **overrides})


def test_defaults():
    config = parse()
    assert (config.num_key_value_heads, config.head_dim, config.num_queries_per_kv) == (4, 16, 1)
    assert (config.rope_theta, config.rope_scaling, config.max_position_embeddings) == (
        10000.0,
        None,
        2048,
    )
    assert config.dtype is torch.float32
    assert not (config.attention_bias or config.o_proj_bias or config.mlp_bias)


def test_explicit_head_dim_and_dtype():
    config = parse(head_dim=32, num_key_value_heads=2, torch_dtype="bfloat16")
    assert (config.head_dim, config.num_queries_per_kv, config.dtype) == (32, 2, torch.bfloat16)


def test_qwen2_implies_qkv_bias_only():
    config = parse(architectures=["Qwen2ForCausalLM"])
    assert config.attention_bias and not config.o_proj_bias


@pytest.mark.parametrize("key", ["type", "rope_type"])
def test_legacy_rope_scaling_accepts_both_type_keys(key):
    config = parse(rope_theta=5e5, rope_scaling={key: "linear", "factor": 2})
    assert config.rope_theta == 5e5
    assert config.rope_scaling == RopeScaling("linear", 2.0)


def test_transformers5_rope_parameters():
    params = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}
    config = parse(max_position_embeddings=4096, rope_parameters=params)
    assert config.rope_theta == 1e6
    assert config.rope_scaling.original_max_position_embeddings == 4096
    assert parse(rope_parameters={"rope_type": "default", "rope_theta": 7.0}).rope_scaling is None


def test_yarn_factor_defaults_to_the_context_ratio():
    scaling = {"rope_type": "yarn", "original_max_position_embeddings": 1024}
    config = parse(max_position_embeddings=4096, rope_scaling=scaling)
    assert config.rope_scaling.factor == 4.0


def test_rope_fingerprint_is_canonical():
    a = parse(
        rope_scaling={"type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4}
    )
    b = parse(
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000,
            "high_freq_factor": 4.0,
            "low_freq_factor": 1.0,
            "factor": 8.0,
            "original_max_position_embeddings": 2048,
        }
    )
    assert a.rope_fingerprint() == b.rope_fingerprint()
    assert json.dumps(a.rope_fingerprint(), sort_keys=True) == (
        '{"max_position_embeddings": 2048, "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, '
        '"low_freq_factor": 1.0, "original_max_position_embeddings": 2048, "rope_type": "llama3", '
        '"truncate": true}, "rope_theta": 10000.0}'
    )
    assert parse().rope_fingerprint() != parse(max_position_embeddings=4096).rope_fingerprint()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"architectures": ["GPT2LMHeadModel"]}, "architectures"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"hidden_size": None}, "hidden_size"),
        ({"head_dim": 15}, "head_dim"),
        ({"rope_scaling": {"type": "longrope", "factor": 2}}, "rope_type"),
        ({"rope_scaling": {"type": "linear"}}, "rope_scaling.factor"),
        ({"rope_scaling": {"type": "llama3", "factor": 8}}, "low_freq_factor"),
        ({"torch_dtype": "float64"}, "torch_dtype"),
        ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
        ({"use_sliding_window": True}, "use_sliding_window"),
    ],
)
def test_errors_name_the_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        parse(**overrides)


def test_file_errors_name_the_file(tmp_path):
    path = tmp_path / "config.json"
    with pytest.raises(ValueError, match="config.json: missing"):
        ModelConfig.from_file(path)
    path.write_text("{")
    with pytest.raises(ValueError, match="config.json: invalid JSON"):
        ModelConfig.from_file(path)
    path.write_text(json.dumps({**BASE, "vocab_size": -1}))
    with pytest.raises(ValueError, match="config.json: vocab_size"):
        ModelConfig.from_file(path)
