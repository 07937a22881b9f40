"""Reusing cached blocks (shared full blocks, a copied partial block) changes nothing."""

from __future__ import annotations

import torch

from tests.workers.model.hf_checkpoints import (
    new_caches,
    paged_greedy,
    random_prompt,
    write_hf_checkpoint,
)
from workers.model.loader import load_model
from workers.model.runner import ModelRunner
from workers.model.step_input import StepInput

BLOCK_SIZE = 8
NUM_BLOCKS = 40


def _runner(tmp_path):
    write_hf_checkpoint(tmp_path, "llama-gqa")
    model = load_model(tmp_path).model
    return ModelRunner(model, *new_caches(model, NUM_BLOCKS, BLOCK_SIZE), BLOCK_SIZE)


def _copy_block(runner: ModelRunner, src: int, dst: int) -> None:
    for cache in runner.caches:
        cache.key[dst] = cache.key[src]
        cache.value[dst] = cache.value[src]


def test_generation_after_cached_prefix_equals_generation_from_scratch(tmp_path):
    runner = _runner(tmp_path)
    shared = random_prompt(35, seed=3)  # 4 full blocks + 3 tokens into block 5
    first = shared + random_prompt(10, seed=4)
    second = shared + random_prompt(12, seed=5)

    # Sequence A fills blocks 0..5 (block 4 is the partial one at position 32..39).
    table_a = [0, 1, 2, 3, 4, 5]
    runner.execute([StepInput(first, 0, table_a)])
    # Sequence B shares A's four full blocks; it copies A's partial block before
    # writing into it, as copy-on-write does, and continues in fresh blocks.
    _copy_block(runner, src=4, dst=20)
    table_b = [0, 1, 2, 3, 20, 21, 22, 23, 24, 25]
    cached = paged_greedy(runner, second, 24, table_b, num_cached=len(shared))

    scratch = paged_greedy(runner, second, 24, [30, 31, 32, 33, 34, 35, 36, 37, 38, 39])
    assert cached == scratch
    # A's blocks are untouched by B's writes.
    logits_again = runner.execute([StepInput(first[-1:], len(first) - 1, table_a)])
    logits_fresh = runner.execute([StepInput(first, 0, [10, 11, 12, 13, 14, 15])])
    torch.testing.assert_close(logits_again, logits_fresh, rtol=0, atol=1e-4)


def test_mixed_batch_equals_separate_steps(tmp_path):
    runner = _runner(tmp_path)
    prompt_a = random_prompt(21, seed=6)
    prompt_b = random_prompt(13, seed=7)
    runner.execute([StepInput(prompt_a, 0, [1, 2, 3])])
    chunk = runner.execute([StepInput(prompt_b[:5], 0, [9, 8])])

    # One step: A decodes a token, B prefills the rest of its prompt over its cached chunk.
    batch = runner.execute([StepInput([7], 21, [1, 2, 3]), StepInput(prompt_b[5:], 5, [9, 8])])
    alone_a = runner.execute([StepInput([7], 21, [1, 2, 3])])
    alone_b = runner.execute([StepInput(prompt_b, 0, [30, 31])])
    assert chunk.shape == (1, 320)
    torch.testing.assert_close(batch[0], alone_a[0], rtol=0, atol=1e-4)
    torch.testing.assert_close(batch[1], alone_b[0], rtol=0, atol=1e-4)
