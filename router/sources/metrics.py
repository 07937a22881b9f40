"""The source planner's Prometheus metrics, on the router's registry (names in
docs/operations.md, Monitoring)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from router.sources.plan import SOURCES

PULL_FAILED = "pull_failed"
TOKEN_SOURCES = ("local", "restored", "pulled", "joined", "recomputed")


class SourceMetrics:
    """Requests by planned source (``pull_failed``: a planned pull whose peer did not
    hold the blocks in time, recomputed instead), prompt tokens by source, and plans
    that broke the planner's own rules (expected 0)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        plans = Counter("router_kv_sources", "Requests whose missing blocks were planned, by "
                        "source: local, restore, pull, join (a pull already on its way to the "
                        "worker brings them), recompute, or pull_failed (a planned pull "
                        "whose hold failed: recomputed)", ["source"], registry=registry)
        self.plans = {source: plans.labels(source) for source in (*SOURCES, PULL_FAILED)}
        tokens = Counter("router_kv_source_tokens", "Prompt tokens by planned source: local, "
                         "restored (the worker's own tiers), pulled, joined (brought by a "
                         "pull already on its way), recomputed", ["source"],
                         registry=registry)
        self.tokens = {source: tokens.labels(source) for source in TOKEN_SOURCES}
        self.broken_rules = Counter("router_kv_pulls_below_crossover", "Pulls planned below "
                                    "the crossover or predicted slower than a recompute "
                                    "(never sent; 0 unless the planner is wrong)",
                                    registry=registry)
