"""ModelRunner's checks on its caches and step inputs."""

from __future__ import annotations

import pytest
import torch

from tests.workers.model.hf_checkpoints import new_caches
from workers.model.demo import ensure_demo_checkpoint
from workers.model.loader import load_model
from workers.model.runner import ModelRunner
from workers.model.step_input import StepInput


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_model(ensure_demo_checkpoint(tmp_path_factory.mktemp("cache"))).model


def test_rejects_caches_of_the_wrong_layout(model):
    keys, values = new_caches(model, 8, 16)
    with pytest.raises(ValueError, match="need 4 key and value caches"):
        ModelRunner(model, keys[:3], values, 16)
    with pytest.raises(
        ValueError, match=r"layer 0 key cache: shape \(8, 16, 4, 32\), expected \(8, 8, 4, 32\)"
    ):
        ModelRunner(model, keys, values, 8)
    half = [v.half() for v in values]
    with pytest.raises(ValueError, match="layer 0 value cache: torch.float16"):
        ModelRunner(model, keys, half, 16)


def test_rejects_bad_steps(model):
    runner = ModelRunner(model, *new_caches(model, 8, 16), 16)
    with pytest.raises(ValueError, match="outside"):
        runner.execute([StepInput([1, 2], 0, [8])])
    with pytest.raises(ValueError, match="cannot hold"):
        runner.execute([StepInput([1] * 17, 0, [0])])
    with pytest.raises(ValueError, match="needs >= 1 new token"):
        runner.execute([StepInput([], 3, [0])])


def test_returns_float32_last_token_logits(model):
    runner = ModelRunner(model, *new_caches(model, 8, 16), 16)
    logits = runner.execute([StepInput([256, 72, 105], 0, [5]), StepInput([256], 0, [6])])
    assert logits.shape == (2, 320) and logits.dtype is torch.float32
    alone = runner.execute([StepInput([256], 0, [7])])
    torch.testing.assert_close(logits[1], alone[0], rtol=0, atol=1e-5)
