"""The LoRA benchmark's workload: Zipf-popular adapters, each with its own system prompt."""

from __future__ import annotations

from collections import Counter

from bench.lora_bench import TOUCH_TOKENS, adapter_name, lora_trace, warm_up_part
from radix.keys import TOKEN_BYTES


def test_adapters_are_drawn_by_popularity_and_share_only_their_own_system_prompt():
    requests, models = lora_trace(2000, 16, zipf=1.0, seed=0)
    counts = Counter(models)
    assert counts[adapter_name(0)] > counts[adapter_name(1)] > counts[adapter_name(8)] > 0
    first = {}
    for request, model in zip(requests, models, strict=True):
        first.setdefault(model, request.prompt[: 200 * TOKEN_BYTES])
        assert request.prompt.startswith(first[model])
    assert len(set(first.values())) == len(first)
    assert all(a.arrival_s < b.arrival_s for a, b in zip(requests, requests[1:], strict=False))


def test_the_warm_up_names_every_adapter_of_the_run_once_more_at_most():
    requests, models = lora_trace(300, 32, zipf=1.0, seed=1)
    warm, warm_models = warm_up_part(requests, models, 50)
    assert warm[:50] == requests[:50] and set(warm_models) == set(models)
    touches = list(zip(warm[50:], warm_models[50:], strict=True))
    assert len(touches) == len(set(models) - set(models[:50])) > 0
    for touch, model in touches:
        first = requests[models.index(model)]
        assert first.prompt.startswith(touch.prompt) and touch.num_prompt_tokens == TOUCH_TOKENS
    assert all(a.arrival_s < b.arrival_s for a, b in zip(warm, warm[1:], strict=False))
