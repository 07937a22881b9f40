"""Sampling: validation, greedy, filters, and per-request reproducibility."""

from __future__ import annotations

import pytest
import torch

from workers.model.sampler import SamplingParams, sample

LOGITS = torch.tensor([[0.0, 3.0, 1.0, 2.5, -1.0], [2.0, 0.0, 0.0, 0.0, 1.9]])


def seeded(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -0.1),
        ("temperature", float("nan")),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", 0),
        ("seed", -1),
        ("max_tokens", 0),
        ("stop_token_ids", (1, -2)),
        ("ignore_eos", 1),
    ],
)
def test_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}:"):
        SamplingParams(**{field: value})


def test_greedy_is_argmax():
    params = [SamplingParams(temperature=0)] * 2
    assert sample(LOGITS, params, [None, None]) == [1, 0]


def test_mixed_batch_keeps_greedy_rows_greedy():
    params = [SamplingParams(temperature=0), SamplingParams(temperature=5.0)]
    for seed in range(20):
        assert sample(LOGITS, params, [None, seeded(seed)])[0] == 1


def test_top_k_one_and_tiny_top_p_are_greedy():
    for params in (SamplingParams(temperature=2.0, top_k=1), SamplingParams(top_p=1e-6)):
        assert sample(LOGITS, [params] * 2, [seeded(1), seeded(2)]) == [1, 0]


def test_filters_restrict_the_support():
    drawn = set()
    for seed in range(200):
        params = [SamplingParams(temperature=10.0, top_k=2), SamplingParams(top_p=0.6)]
        first, second = sample(LOGITS, params, [seeded(seed), seeded(seed + 1000)])
        assert first in (1, 3)
        assert second in (0, 4)  # the two tokens holding > 60% of the mass
        drawn.update({(0, first), (1, second)})
    assert drawn == {(0, 1), (0, 3), (1, 0), (1, 4)}


def test_seeded_rows_are_reproducible_and_independent_of_the_batch():
    vocab_logits = torch.randn(3, 1000, generator=seeded(0))
    params = [SamplingParams(temperature=1.0, top_p=0.9, seed=7)] * 3
    together = sample(vocab_logits, params, [seeded(7), seeded(8), seeded(9)])
    alone = sample(vocab_logits[1:2], params[:1], [seeded(8)])
    assert together[1] == alone[0]
    assert together == sample(vocab_logits, params, [seeded(7), seeded(8), seeded(9)])


def test_sampling_follows_the_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    generator = seeded(3)
    counts = torch.zeros(3)
    for _ in range(3000):
        counts[sample(logits, [SamplingParams()], [generator])[0]] += 1
    assert torch.allclose(counts / 3000, torch.tensor([0.5, 0.3, 0.2]), atol=0.03)


def test_mismatched_lengths_raise():
    with pytest.raises(ValueError, match="logit rows"):
        sample(LOGITS, [SamplingParams()], [None])
