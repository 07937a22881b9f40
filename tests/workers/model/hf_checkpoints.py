"""Tiny random checkpoints written by transformers (the oracle) and paged generation helpers."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from radix.tokenizer import demo_tokenizer_files
from workers.model.llama import LlamaForCausalLM as PagedLlama
from workers.model.runner import ModelRunner
from workers.model.step_input import StepInput

TINY = {
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 256,
    # Wide weights spread the logits, so greedy choices are far from ties.
    "initializer_range": 0.2,
    "bos_token_id": 256,
    "eos_token_id": 257,
}

VARIANTS: dict[str, dict[str, Any]] = {
    "llama-mha": {"num_key_value_heads": 4},
    "llama-gqa": {"num_key_value_heads": 2},
    "llama-bias": {"num_key_value_heads": 2, "attention_bias": True, "mlp_bias": True},
    "llama-linear": {"num_key_value_heads": 2, "rope_scaling": {"type": "linear", "factor": 2.0}},
    # max positions 24 < prompt + 32 generated: decoding runs past the dynamic threshold.
    "llama-dynamic": {
        "num_key_value_heads": 2,
        "max_position_embeddings": 24,
        "rope_scaling": {"rope_type": "dynamic", "factor": 2.0},
    },
    "llama-llama3": {
        "num_key_value_heads": 2,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    },
    "llama-yarn": {
        "num_key_value_heads": 2,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    },
    "qwen2-bias-tied": {"num_key_value_heads": 2, "tie_word_embeddings": True},
}


def write_hf_checkpoint(path: Path, variant: str, seed: int = 0) -> torch.nn.Module:
    """Save a tiny transformers model of ``variant`` plus the demo tokenizer into ``path``."""
    torch.manual_seed(seed)
    kwargs = {**TINY, **VARIANTS[variant]}
    if variant.startswith("qwen2"):
        model: torch.nn.Module = Qwen2ForCausalLM(Qwen2Config(**kwargs))
    else:
        model = LlamaForCausalLM(LlamaConfig(**kwargs))
    model.eval()
    model.save_pretrained(path)
    for name, text in demo_tokenizer_files().items():
        (path / name).write_bytes(text.encode())
    return model


def hf_greedy(model: torch.nn.Module, prompt: Sequence[int], num_tokens: int) -> list[int]:
    """transformers ``generate(do_sample=False)`` continuation of ``prompt``, never stopping early."""
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        output = model.generate(
            torch.tensor([list(prompt)]), max_new_tokens=num_tokens, do_sample=False
        )
    return output[0, len(prompt) :].tolist()


def new_caches(model: PagedLlama, num_blocks: int, block_size: int) -> tuple[list, list]:
    """Zeroed per-layer key and value caches in the layout the runner expects, on the
    model's device."""
    config = model.config
    shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
    weight = model.lm_head.weight
    keys = [torch.zeros(shape, dtype=weight.dtype, device=weight.device)
            for _ in range(config.num_hidden_layers)]
    values = [torch.zeros_like(key) for key in keys]
    return keys, values


def shuffled_blocks(num_blocks: int, seed: int = 1) -> list[int]:
    """All block ids in a scrambled order, so block tables are never contiguous."""
    blocks = list(range(num_blocks))
    random.Random(seed).shuffle(blocks)
    return blocks


def paged_greedy(
    runner: ModelRunner,
    prompt: Sequence[int],
    num_tokens: int,
    block_table: Sequence[int],
    num_cached: int = 0,
) -> list[int]:
    """Greedy continuation through ``runner``: prefill ``prompt[num_cached:]`` (the first
    ``num_cached`` tokens are already in ``block_table``'s blocks), then decode one
    token per step."""
    tokens = list(prompt)
    logits = runner.execute([StepInput(tokens[num_cached:], num_cached, block_table)])
    generated = [int(logits[0].argmax())]
    while len(generated) < num_tokens:
        tokens.append(generated[-1])
        logits = runner.execute([StepInput([generated[-1]], len(tokens) - 1, block_table)])
        generated.append(int(logits[0].argmax()))
    return generated


def random_prompt(length: int, seed: int = 0, vocab: int = 262) -> list[int]:
    """A reproducible random prompt of ``length`` ids below ``vocab``."""
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(length)]
