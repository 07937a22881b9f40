"""The LoRA benchmark's workload: Zipf-popular adapters, each with its own system prompt."""

from __future__ import annotations

from collections import Counter

from bench.lora_bench import adapter_name, lora_trace
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
