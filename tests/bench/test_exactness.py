"""``bench.exactness``: the router's prediction counters read from a real exposition,
and a run's exactness from two readings."""

from __future__ import annotations

import math

from bench.exactness import counts_in, describe, exactness
from bench.report_timed import timed_table
from router.metrics import RouterMetrics


def test_counts_sum_each_outcome_over_workers_and_namespaces():
    metrics = RouterMetrics()
    assert counts_in(metrics.render([]).decode()) == {"exact": 0, "over": 0, "under": 0,
                                                      "in_flight": 0}
    for worker, namespace, outcome in (("w0", "n0", "exact"), ("w0", "n0", "exact"),
                                       ("w1", "n1", "over"), ("w1", "n2", "exact"),
                                       ("w1", "n2", "in_flight")):
        metrics.count_prediction(worker, namespace, outcome, 32, 0, 32)
    assert counts_in(metrics.render([]).decode()) == {"exact": 3, "over": 1, "under": 0,
                                                      "in_flight": 1}


def test_exactness_is_the_difference_of_two_readings_in_flight_left_out_of_the_fraction():
    before = {"exact": 10.0, "over": 1.0, "under": 0.0, "in_flight": 2.0}
    after = {"exact": 106.0, "over": 2.0, "under": 3.0, "in_flight": 9.0}
    figures = exactness(before, after)
    assert figures == {"num_exact": 96, "num_over": 1, "num_under": 3, "num_in_flight": 7,
                       "exact_fraction": 0.96}
    assert describe(figures) == "96/1/3/7 (96.0%)"
    assert math.isnan(exactness(before, before)["exact_fraction"])
    assert describe({"cached_fraction": 0.5}) == "-"


def test_the_timed_table_shows_each_runs_exactness():
    run = {"ttft_p50_s": 0.05, "ttft_p99_s": 0.1, "cached_fraction": 0.4, "goodput_rps": 9.0,
           "max_over_mean_load": 1.2, "num_errors": 0}
    results = {"profile": "p", "time_scale": 20.0, "slo_s": 0.25, "runs": {
        "rag/8/0.8/ours": {**run, **exactness(
            {"exact": 0, "over": 0, "under": 0, "in_flight": 0},
            {"exact": 99, "over": 1, "under": 0, "in_flight": 4})},
        "rag/8/0.8/peer": run}}
    rows = [line for line in timed_table(results) if line.startswith("| rag")]
    assert rows[0].endswith("| 99/1/0/4 (99.0%) |") and rows[1].endswith("| - |")
