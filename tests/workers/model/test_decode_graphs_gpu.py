"""Decode replayed from CUDA graphs gives eager decoding's greedy tokens, on a GPU."""

from __future__ import annotations

import pytest
import torch

from tests.support.gpu import ON_GPU
from tests.workers.model.hf_checkpoints import new_caches
from workers.model.demo import ensure_demo_checkpoint
from workers.model.loader import load_model
from workers.model.runner import GraphPlan, ModelRunner
from workers.model.step_input import StepInput

pytestmark = ON_GPU


def greedy(runner: ModelRunner, prompts: list[list[int]], num_tokens: int,
           slots: list[int | None] | None = None) -> list[list[int]]:
    """``num_tokens`` greedy tokens per prompt, all prompts decoded as one batch, prompt
    ``i`` under adapter slot ``slots[i]``."""
    slots = slots or [None] * len(prompts)
    tables = [list(range(8 * row + 1, 8 * row + 9)) for row in range(len(prompts))]
    logits = runner.execute([StepInput(p, 0, t, s)
                             for p, t, s in zip(prompts, tables, slots, strict=True)])
    tokens = [[token] for token in logits.argmax(-1).tolist()]
    for step in range(num_tokens - 1):
        batch = [StepInput([out[-1]], len(prompt) + step, table, slot)
                 for out, prompt, table, slot in zip(tokens, prompts, tables, slots, strict=True)]
        for out, token in zip(tokens, runner.execute(batch).argmax(-1).tolist(), strict=True):
            out.append(token)
    return tokens


@pytest.mark.parametrize("batch", [1, 3, 16])
def test_graphs_give_the_eager_greedy_tokens(tmp_path, batch):
    from workers.model.decode_graphs import CudaGraphCapture

    model = load_model(ensure_demo_checkpoint(tmp_path), "cuda").model
    prompts = [[(11 * row + 3 * i) % 250 + 1 for i in range(9 + 5 * row)] for row in range(batch)]
    eager = ModelRunner(model, *new_caches(model, 8 * batch + 1, 16), 16)
    graphed = ModelRunner(model, *new_caches(model, 8 * batch + 1, 16), 16,
                          graphs=GraphPlan(CudaGraphCapture(), 16, 128))
    assert graphed.graphs is not None
    assert greedy(graphed, prompts, 24) == greedy(eager, prompts, 24)


def test_graphs_with_adapters_give_the_eager_greedy_tokens(tmp_path):
    from workers.lora.peft_files import BaseShapes
    from workers.lora.weights import LoraWeights
    from workers.model.decode_graphs import CudaGraphCapture

    model = load_model(ensure_demo_checkpoint(tmp_path), "cuda").model
    config = model.config
    shapes = BaseShapes.llama(config.num_hidden_layers, config.hidden_size,
                              config.intermediate_size, config.num_attention_heads,
                              config.num_key_value_heads, config.head_dim, 4)
    weights = LoraWeights(shapes, 2, 8, torch.float32, "cuda")
    generator = torch.Generator(device="cuda").manual_seed(0)
    for tensor in (*weights.lora_a.values(), *weights.lora_b.values()):
        tensor.normal_(0, 0.5, generator=generator)
    weights.scales.fill_(0.5)
    prompts = [[(7 * row + 5 * i) % 250 + 1 for i in range(11 + 3 * row)] for row in range(5)]
    slots = [0, None, 1, 1, None]
    eager = ModelRunner(model, *new_caches(model, 41, 16), 16, lora=weights)
    graphed = ModelRunner(model, *new_caches(model, 41, 16), 16, lora=weights,
                          graphs=GraphPlan(CudaGraphCapture(), 8, 128))
    assert greedy(graphed, prompts, 16, slots) == greedy(eager, prompts, 16, slots)
    assert greedy(graphed, prompts, 4, slots) != greedy(graphed, prompts, 4)  # the adapters change the tokens
