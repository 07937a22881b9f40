"""How exactly our router predicted its workers' cache, from its own ``/metrics``.

The router checks every answered request whose worker reported ``cached_tokens``
against the index's prediction, in whole blocks (docs/router.md, the learn step), and
counts the outcome in ``router_cache_predictions_total{worker, namespace, outcome}``.
A benchmark reads the counters before and after a run (``prediction_counts``) and
reports the difference (``exactness``): exact, over, under and in_flight counts and
the exact fraction, exact / (exact + over + under): ``in_flight`` (a shortfall only
in what requests in flight vouched for) is no miss of the index.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from harness.procs import http_json

OUTCOMES = ("exact", "over", "under", "in_flight")
_JUDGED = ("exact", "over", "under")
SAMPLE = "router_cache_predictions_total"


def prediction_counts(metrics_url: str) -> dict[str, float]:
    """The router's checked predictions so far by outcome, summed over its workers and
    namespaces (0 for an outcome never counted)."""
    status, text = http_json("GET", f"{metrics_url}/metrics")
    if status != 200:
        raise RuntimeError(f"router /metrics answered {status}")
    return counts_in(str(text))


def counts_in(text: str) -> dict[str, float]:
    """``prediction_counts`` of a Prometheus text exposition."""
    counts = dict.fromkeys(OUTCOMES, 0.0)
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == SAMPLE and found.labels.get("outcome") in counts:
                counts[found.labels["outcome"]] += found.value
    return counts


def exactness(before: dict[str, float], after: dict[str, float]) -> dict[str, float | int]:
    """The checks between two ``prediction_counts``: ``num_exact``, ``num_over``,
    ``num_under``, ``num_in_flight`` and ``exact_fraction``, exact / (exact + over +
    under) (NaN when there are none of those)."""
    counts = {outcome: int(after[outcome] - before[outcome]) for outcome in OUTCOMES}
    num_checked = sum(counts[outcome] for outcome in _JUDGED)
    return {**{f"num_{outcome}": n for outcome, n in counts.items()},
            "exact_fraction": counts["exact"] / num_checked if num_checked else float("nan")}


def describe(figures: dict) -> str:
    """``exact/over/under/in_flight (exact fraction)`` of a run's figures, or ``-``
    when the run has none (a peer router)."""
    if "exact_fraction" not in figures:
        return "-"
    return (f"{figures['num_exact']}/{figures['num_over']}/{figures['num_under']}/"
            f"{figures.get('num_in_flight', 0)} ({figures['exact_fraction']:.1%})")
