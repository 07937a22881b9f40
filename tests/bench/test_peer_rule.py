"""The peers' threshold rule, on cases worked by hand."""

from __future__ import annotations

import pytest

from bench.peer_rule import DEFAULT_THRESHOLDS, TUNED_THRESHOLDS, ThresholdPolicy
from router.routing.index import WorkerId
from router.routing.policy import NoWorkerError
from router.routing.views import RouteRequest, WorkerView

NS = "ab" * 32


def request(num_prompt_tokens: int = 100) -> RouteRequest:
    return RouteRequest(NS, b"\0" * 4 * num_prompt_tokens, num_prompt_tokens, "t")


def view(name: str, matched: int = 0, load: int = 0) -> WorkerView:
    return WorkerView(WorkerId(name), num_matched_tokens=matched, num_in_flight_requests=load)


def test_balanced_cluster_goes_to_the_longest_match_above_the_threshold():
    rule = ThresholdPolicy(**DEFAULT_THRESHOLDS)
    decision = rule.choose(request(100), [view("a", 10, 0), view("b", 31, 60), view("c", 0, 1)])
    assert decision.chosen == "b"  # 31/100 > 0.3; loads 60 - 0 = 60 is not > 64
    assert decision.ranked == ("b", "a", "c")  # then by load


def test_match_at_the_threshold_goes_to_the_smallest_tree():
    rule = ThresholdPolicy(**DEFAULT_THRESHOLDS)
    assert rule.choose(request(100), [view("a"), view("b")]).chosen == "a"  # both empty: list order
    assert rule.tree_tokens == {"a": 100}
    decision = rule.choose(request(100), [view("a", 30), view("b")])  # 30/100 is not > 0.3
    assert decision.chosen == "b"
    assert rule.tree_tokens == {"a": 100, "b": 100}
    rule.choose(request(50), [view("a", 40), view("b", 10)])  # 40/50 > 0.3: a, adds 10
    assert rule.tree_tokens == {"a": 110, "b": 100}
    assert rule.choose(request(100), [view("a"), view("b")]).chosen == "b"  # smaller tree


def test_imbalance_needs_both_the_absolute_and_the_relative_gap():
    default, tuned = ThresholdPolicy(**DEFAULT_THRESHOLDS), ThresholdPolicy(**TUNED_THRESHOLDS)
    hot = [view("a", 90, 70), view("b", 0, 2)]
    assert default.choose(request(), hot).chosen == "b"  # 68 > 64 and 70 > 1.5 * 2
    warm = [view("a", 90, 10), view("b", 0, 1)]
    assert default.choose(request(), warm).chosen == "a"  # 9 is not > 64
    assert tuned.choose(request(), warm).chosen == "b"  # 9 > 8 and 10 > 1.2 * 1
    close = [view("a", 90, 100), view("b", 0, 90)]
    assert tuned.choose(request(), close).chosen == "a"  # 10 > 8 but 100 is not > 108
    apart = [view("a", 90, 100), view("b", 0, 80)]
    assert tuned.choose(request(), apart).chosen == "b"  # 20 > 8 and 100 > 96


def test_no_worker_is_an_error():
    with pytest.raises(NoWorkerError):
        ThresholdPolicy().choose(request(), [])
