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
    with pytest.raises(ValueError, match="layer 0 value cache: torch.float16, its key cache "
                                         "torch.float32"):
        ModelRunner(model, keys, half, 16)
    ints = [k.to(torch.int16) for k in keys]
    with pytest.raises(ValueError, match="layer 0 key cache: torch.int16 on cpu, model is "
                                         "torch.float32"):
        ModelRunner(model, ints, [v.to(torch.int16) for v in values], 16)


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


def test_a_bf16_cache_beside_a_float32_model_stores_rounded_kv_and_attends_over_it(model):
    """On the CPU a cache may be bf16 while the model runs in float32 (what a GPU's
    cache holds, for the quality gate): it stores each K and V rounded to bf16 (the
    first layer's, computed from the embeddings alone, equal a float32 cache's
    rounded), and the logits stay close to a float32 cache's."""
    exact = ModelRunner(model, *new_caches(model, 8, 16), 16)
    keys, values = new_caches(model, 8, 16)
    rounded = ModelRunner(model, [k.bfloat16() for k in keys], [v.bfloat16() for v in values], 16)
    steps = [StepInput([256, 72, 105, 108], 0, [5]), StepInput([256, 9], 0, [6])]
    want, got = exact.execute(steps), rounded.execute(steps)
    assert {layer.key.dtype for layer in rounded.caches} == {torch.bfloat16}
    full, half = exact.caches[0], rounded.caches[0]
    assert torch.equal(half.key, full.key.bfloat16())
    assert torch.equal(half.value, full.value.bfloat16())
    torch.testing.assert_close(got, want, rtol=0, atol=0.1)
    assert not torch.equal(got, want)  # the rounding reached the logits
