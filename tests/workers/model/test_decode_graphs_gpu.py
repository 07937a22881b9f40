"""Decode replayed from CUDA graphs gives eager decoding's greedy tokens, on a GPU."""

from __future__ import annotations

import pytest
import torch

from tests.workers.model.hf_checkpoints import new_caches
from workers.model.demo import ensure_demo_checkpoint
from workers.model.loader import load_model
from workers.model.runner import GraphPlan, ModelRunner
from workers.model.step_input import StepInput

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.xdist_group("gpu"),  # one device: one test on it at a time
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def greedy(runner: ModelRunner, prompts: list[list[int]], num_tokens: int) -> list[list[int]]:
    """``num_tokens`` greedy tokens per prompt, all prompts decoded as one batch."""
    tables = [list(range(8 * row + 1, 8 * row + 9)) for row in range(len(prompts))]
    logits = runner.execute([StepInput(p, 0, t) for p, t in zip(prompts, tables, strict=True)])
    tokens = [[token] for token in logits.argmax(-1).tolist()]
    for step in range(num_tokens - 1):
        batch = [StepInput([out[-1]], len(prompt) + step, table)
                 for out, prompt, table in zip(tokens, prompts, tables, strict=True)]
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
