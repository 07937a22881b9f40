"""The reference harness: reuse counting, the trace's shape, and a small run of ours."""

from __future__ import annotations

import collections

import pytest

from bench import reference
from harness.reuse import ReuseMeter


def test_meter_counts_the_longest_prefix_seen_before_unlimited_and_under_lru():
    meter = ReuseMeter(lru_tokens=6)
    assert meter.observe([1, 2, 3, 4]) == 0
    assert meter.observe([1, 2, 3, 9, 9]) == 3
    assert meter.observe([7, 7, 7, 7, 7, 7]) == 0  # the capped tree evicts the older prompts
    assert meter.observe([1, 2, 3, 4, 5]) == 4
    stats = meter.stats()
    assert (stats.num_requests, stats.num_prompt_tokens, stats.num_seen_tokens) == (4, 20, 7)
    assert stats.num_seen_lru_tokens == 3
    assert stats.num_working_set_tokens == 4 + 2 + 6 + 1
    meter.reset()
    assert meter.stats().num_requests == 0 and meter.observe([1, 2]) == 0


def test_trace_mixes_one_document_questions_and_ten_turn_conversations():
    requests = reference.trace(600)
    turns = collections.Counter(r.session for r in requests)
    assert len(requests) == 600
    assert max(turns.values()) <= 10 and sum(n > 1 for n in turns.values()) >= 5
    bound, working_set = reference.single_worker([reference.prompt_text(r) for r in requests])
    assert 0.5 < bound < 1.0 and working_set > 40 * 3600


@pytest.mark.slow
def test_small_run_of_ours_reports_reuse_and_balance():
    results = reference.main(["--requests", "60", "--clients", "4", "--without-peers"])
    ours = results[reference.OURS]
    assert ours["num_failed"] == 0 and sum(ours["requests_per_worker"]) == 60
    assert 0 < ours["reuse_lru"] <= ours["reuse_unlimited"] <= results["single_worker_bound"] + 1e-9
