"""A timed worker as a real process: the profile's KV plan, repeatable outputs, and
the prefix cache and KV events of the real engine."""

from __future__ import annotations

import pytest

from radix.cost_model import get_profile
from workers.kv.plan import plan_kv_cache
from workers.model.timed import timed_kv_spec

pytestmark = pytest.mark.slow
PROFILE = "llama3-70b-h100x4"


def _complete(worker, prompt: str) -> dict:
    status, body = worker.post_json("/v1/completions", {
        "model": f"timed:{PROFILE}", "prompt": prompt, "max_tokens": 12, "temperature": 0})
    assert status == 200, body
    return body


def test_a_timed_worker_serves_its_profile_with_the_real_cache(worker_factory):
    first, second = (worker_factory("--model", f"timed:{PROFILE}") for _ in range(2))
    status, info = first.get_json("/info")
    assert status == 200
    plan = plan_kv_cache(timed_kv_spec(get_profile(PROFILE), 16), get_profile(PROFILE).kv_cache_bytes)
    assert info["kv_plan"]["num_blocks"] == plan.num_blocks
    assert info["kv_plan"]["kv_bytes_per_token"] == 2 * 80 * 8 * 128 * 2
    prompt = "the quick brown fox jumps over the lazy dog " * 4
    one = _complete(first, prompt)
    assert one["choices"][0]["finish_reason"] == "length"
    assert one["choices"][0]["text"].isalpha()
    assert _complete(second, prompt)["choices"][0]["text"] == one["choices"][0]["text"]
    again = _complete(first, prompt + "and runs")
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= 160
