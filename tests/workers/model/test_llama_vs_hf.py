"""Our paged Llama against transformers on the same tiny checkpoints (the oracle)."""

from __future__ import annotations

import pytest
import torch

from tests.workers.model.hf_checkpoints import (
    VARIANTS,
    hf_greedy,
    new_caches,
    paged_greedy,
    random_prompt,
    shuffled_blocks,
    write_hf_checkpoint,
)
from workers.attention.backend import LayerKVCache
from workers.attention.metadata import AttentionMetadata
from workers.model.loader import load_model
from workers.model.runner import ModelRunner

BLOCK_SIZE = 4
NUM_BLOCKS = 32
PROMPT_LEN = 19
NUM_GENERATED = 32


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_and_greedy_tokens_match_transformers(tmp_path, variant):
    hf_model = write_hf_checkpoint(tmp_path, variant)
    loaded = load_model(tmp_path)
    prompt = random_prompt(PROMPT_LEN)
    blocks = shuffled_blocks(NUM_BLOCKS)

    with torch.no_grad():
        expected = hf_model(torch.tensor([prompt])).logits[0]
    keys, values = new_caches(loaded.model, NUM_BLOCKS, BLOCK_SIZE)
    metadata = AttentionMetadata.build(
        [PROMPT_LEN], [0], [blocks[:5]], BLOCK_SIZE, NUM_BLOCKS, "cpu"
    )
    with torch.inference_mode():
        hidden = loaded.model(torch.tensor(prompt), [LayerKVCache(k, v) for k, v in zip(keys, values, strict=True)], metadata)
        logits = loaded.model.compute_logits(hidden)
    assert (logits - expected).abs().max().item() < 1e-4

    runner = ModelRunner(
        loaded.model, *new_caches(loaded.model, NUM_BLOCKS, BLOCK_SIZE), BLOCK_SIZE
    )
    ours = paged_greedy(runner, prompt, NUM_GENERATED, blocks[:13])
    assert ours == hf_greedy(hf_model, prompt, NUM_GENERATED)
