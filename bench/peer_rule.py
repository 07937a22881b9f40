"""The peers' cache-aware rule (sglang-router and vllm-router ``cache_aware``), written
again from its description, for the simulator to compare against.

The rule, per request, over the router's own in-flight request counts ("load"):

1. Imbalanced when ``max load - min load > balance_abs_threshold`` and
   ``max load > balance_rel_threshold * min load``: send to the least loaded worker.
2. Otherwise take the worker with the longest prefix in the router's approximate tree
   (what it routed, no KV events); if that prefix is more than ``cache_threshold`` of
   the prompt, send there.
3. Otherwise send to the worker whose tree is smallest.

Either way the prompt is inserted into the chosen worker's tree. Both peers run this
rule over characters; here it runs over tokens, which changes no ratio the rule
compares. Ties the peers leave to hash-map order go to the least loaded, then to list
order, so runs repeat.
"""

from __future__ import annotations

from collections.abc import Sequence

from router.routing.index import WorkerId
from router.routing.policy import NoWorkerError, Policy, RouteDecision
from router.routing.views import RouteRequest, WorkerView

DEFAULT_THRESHOLDS = {"cache_threshold": 0.3, "balance_abs_threshold": 64, "balance_rel_threshold": 1.5}
TUNED_THRESHOLDS = {"cache_threshold": 0.3, "balance_abs_threshold": 8, "balance_rel_threshold": 1.2}


class ThresholdPolicy(Policy):
    """The peers' rule. Load is ``num_in_flight_requests`` (the peers count requests
    from routing to the end of the response); matched tokens come from an approximate
    index (the simulator runs it without KV events). Keeps, as its own state, the
    tokens it has inserted into each worker's tree (prompt minus what that worker's
    tree already held), which is what "smallest tree" compares."""

    name = "threshold"

    def __init__(self, cache_threshold: float = 0.3, balance_abs_threshold: float = 64,
                 balance_rel_threshold: float = 1.5) -> None:
        super().__init__()
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.tree_tokens: dict[WorkerId, int] = {}

    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> RouteDecision:
        """The rule's worker first, then the rest by load."""
        if not workers:
            raise NoWorkerError("no routable worker")
        by_load = sorted(workers, key=lambda v: v.num_in_flight_requests)
        chosen = self.pick(request, workers, by_load)
        self.tree_tokens[chosen.worker_id] = (self.tree_tokens.get(chosen.worker_id, 0)
                                              + request.num_prompt_tokens - chosen.num_matched_tokens)
        return self._decide(request, [chosen, *(v for v in by_load if v is not chosen)])

    def pick(self, request: RouteRequest, workers: Sequence[WorkerView],
             by_load: Sequence[WorkerView]) -> WorkerView:
        """Steps 1-3 of the module docstring; changes nothing."""
        low, high = by_load[0].num_in_flight_requests, by_load[-1].num_in_flight_requests
        if high - low > self.balance_abs_threshold and high > self.balance_rel_threshold * low:
            return by_load[0]
        best = max(by_load, key=lambda v: v.num_matched_tokens)
        if best.num_matched_tokens > self.cache_threshold * request.num_prompt_tokens:
            return best
        return min(by_load, key=lambda v: self.tree_tokens.get(v.worker_id, 0))
