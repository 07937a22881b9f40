"""Routing policies: rank the routable workers for one request, best first.

Every policy is ``choose(request, workers) -> RouteDecision``; the proxy sends the
request to ``ranked[0]`` and retries down the list. ``cache_aware`` (the default)
weighs each worker's cached prefix against its load in one continuous cost::

    cost(w) = prefill_cost_per_token * prefill_units(matched(w), prompt tokens)
              + load_cost(w) + adapter_cost(w)

(``router.routing.load_cost``: a token's prefill grows with the context before it).
``adapter_cost`` is 0 for the base model and where the request's LoRA adapter is
resident; elsewhere ``adapter_load_cost_per_ms`` times the
load's milliseconds, plus ``adapter_swap_cost`` times ``adapter_swap_share`` where the
load evicts another adapter (``router.routing.adapters``). The lowest cost wins; ties go to the least loaded, then to
rendezvous-hash order. A request whose longest match covers at least
``owner_min_share`` of its prompt stays on the workers holding it (its owners) while
one is under a bounded-load cap and the prefill this router queued on it exceeds the
least-queued worker's by at most ``owner_wait_share`` times the match, so a passing
queue does not copy a hot prefix around; with every owner past either bound the cost
decides, and may replicate it to a second worker; owners whose adapter cost is above
the lowest are not owners. A cold prefix (no worker matches any of it, and the
adapter cost is 0 everywhere) goes to the first
worker in rendezvous-hash order of its first tokens that is under the bounded-load
cap, so concurrent requests for a new document meet on one worker and different
documents spread. ``round_robin``, ``least_load``, ``consistent_hash`` and ``random``
exist for comparison and fallback. Policies read only the ``WorkerView`` snapshots
they are given; the caller updates in-flight counts and the index after deciding.
"""

from __future__ import annotations

import functools
import itertools
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from types import MappingProxyType
from typing import ClassVar, NamedTuple

from router.routing.index import WorkerId
from router.routing.load_cost import (
    PolicyWeights,
    bounded_load_cap,
    bounded_load_pick,
    load_cost,
    load_costs,
    num_active_requests,
    num_queued_prefill_tokens,
    prefill_units,
    rendezvous_order,
)
from router.routing.views import RouteRequest, WorkerView


class WorkerScore(NamedTuple):
    """The numbers behind a worker's rank, for logs and metrics."""

    worker_id: WorkerId
    num_matched_tokens: int
    load_cost: float
    cost: float


@dataclass(frozen=True)
class RouteDecision:
    """Every given worker, best first (``ranked``), with ``scores`` in the same order.
    ``cold`` is True when cache_aware found no match and spread by hash."""

    policy: str
    ranked: tuple[WorkerId, ...]
    scores: tuple[WorkerScore, ...]
    cold: bool = False

    @property
    def chosen(self) -> WorkerId:
        """The worker to try first."""
        return self.ranked[0]

    @property
    def num_matched_tokens(self) -> int:
        """Tokens the chosen worker is believed to hold."""
        return self.scores[0].num_matched_tokens


# A WorkerScore from a tuple of its fields, in C (its generated ``__new__`` is a Python
# call, made for every worker per request); its fields by position, for C-level sorts
# and scans over every worker.
_score = functools.partial(tuple.__new__, WorkerScore)
_MATCHED = itemgetter(1)
_COST_THEN_LOAD = itemgetter(3, 2)


class NoWorkerError(LookupError):
    """``choose`` was given no worker."""


class Policy(ABC):
    """A routing policy. ``choose`` ranks every worker it is given exactly once, raises
    NoWorkerError when given none, and changes no state but its own (round-robin
    position, random generator)."""

    name: ClassVar[str]

    def __init__(self, weights: PolicyWeights | None = None) -> None:
        self.weights = weights or PolicyWeights()

    @abstractmethod
    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> RouteDecision:
        """Rank ``workers`` for ``request``, best first."""

    def _decide(self, request: RouteRequest, ranked: Sequence[WorkerView]) -> RouteDecision:
        scores = self._scores(request, ranked)
        return RouteDecision(self.name, tuple(s.worker_id for s in scores), tuple(scores))

    def _scores(self, request: RouteRequest, views: Sequence[WorkerView]) -> list[WorkerScore]:
        """Each view's score, in order: cost = prefill of its uncached tokens + load."""
        prefill, num_prompt_tokens = self.weights.prefill_cost_per_token, request.num_prompt_tokens
        context = self.weights.prefill_context_cost
        per_ms, swap = self.weights.adapter_load_cost_per_ms, self.weights.adapter_swap_cost
        return [
            _score((view.worker_id, view.num_matched_tokens, load,
                    prefill * prefill_units(view.num_matched_tokens, num_prompt_tokens, context)
                    + load + per_ms * view.adapter_load_ms + swap * view.adapter_swap_share))
            for view, load in zip(views, load_costs(views, self.weights), strict=True)
        ]


def _require(workers: Sequence[WorkerView]) -> None:
    if not workers:
        raise NoWorkerError("no routable worker")


class CacheAwarePolicy(Policy):
    """Lowest prefill-plus-load cost; cold prefixes by bounded-load consistent hashing."""

    name = "cache_aware"

    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> RouteDecision:
        """Lowest cost first; a cold prefix's hash choice first."""
        _require(workers)
        ranked = self._by_cost(request, self._scores(request, workers))
        cold = not any(map(_MATCHED, ranked)) and not any(map(self.adapter_cost, workers))
        if cold:
            order = rendezvous_order(request.key, workers, self.weights.hash_prefix_tokens)
            first = bounded_load_pick(order, self.weights.load_cap_factor).worker_id
            ranked = [s for s in ranked if s.worker_id == first] + [s for s in ranked if s.worker_id != first]
        elif self.weights.owner_load_cap_factor or self.weights.owner_wait_share:
            ranked = self._owners_first(request, workers, ranked)
        return RouteDecision(self.name, tuple(s.worker_id for s in ranked), tuple(ranked), cold)

    def adapter_cost(self, view: WorkerView) -> float:
        """The adapter's part of ``view``'s cost (module docstring)."""
        return (self.weights.adapter_load_cost_per_ms * view.adapter_load_ms
                + self.weights.adapter_swap_cost * view.adapter_swap_share)

    def _by_cost(self, request: RouteRequest, scores: list[WorkerScore]) -> list[WorkerScore]:
        """``scores`` by (cost, load cost), equal pairs in rendezvous-hash order (hashed
        only where pairs are equal: the hash order of a subset is the full order's)."""
        ranked = sorted(scores, key=_COST_THEN_LOAD)
        if len(set(map(_COST_THEN_LOAD, ranked))) == len(ranked):
            return ranked
        by_cost, ranked = ranked, []
        for _, group in itertools.groupby(by_cost, key=_COST_THEN_LOAD):
            tied = list(group)
            ranked += tied if len(tied) == 1 else rendezvous_order(
                request.key, tied, self.weights.hash_prefix_tokens)
        return ranked

    def _owners_first(self, request: RouteRequest, workers: Sequence[WorkerView],
                      ranked: list[WorkerScore]) -> list[WorkerScore]:
        """``ranked`` with the owners of the longest match under the owner cap and the
        wait bound moved to the front (in cost order), when that match is long enough
        to stick to."""
        weights = self.weights
        best = max(map(_MATCHED, ranked))
        if best < weights.owner_min_share * request.num_prompt_tokens:
            return ranked
        owners = [v for v in workers if v.num_matched_tokens == best]
        least = min(map(self.adapter_cost, workers))
        owners = [v for v in owners if self.adapter_cost(v) <= least]
        if not owners or len(owners) == len(workers):
            return ranked
        if weights.owner_load_cap_factor:
            cap = bounded_load_cap(workers, weights.owner_load_cap_factor)
            owners = [v for v in owners if num_active_requests(v) < cap]
        if weights.owner_wait_share:
            max_wait = min(map(num_queued_prefill_tokens, workers)) + weights.owner_wait_share * best
            owners = [v for v in owners if num_queued_prefill_tokens(v) <= max_wait]
        owner_ids = {v.worker_id for v in owners}
        return ([s for s in ranked if s.worker_id in owner_ids]
                + [s for s in ranked if s.worker_id not in owner_ids])


class RoundRobinPolicy(Policy):
    """Each call starts one position further along the given worker list."""

    name = "round_robin"

    def __init__(self, weights: PolicyWeights | None = None) -> None:
        super().__init__(weights)
        self._next = 0

    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> RouteDecision:
        """The given order, rotated one further than last time."""
        _require(workers)
        start = self._next % len(workers)
        self._next = start + 1
        return self._decide(request, [*workers[start:], *workers[:start]])


class LeastLoadPolicy(Policy):
    """Lowest load cost; ties in list order. Ignores cached prefixes."""

    name = "least_load"

    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> RouteDecision:
        """Lowest load cost first."""
        _require(workers)
        return self._decide(request, sorted(workers, key=lambda v: load_cost(v, self.weights)))


class ConsistentHashPolicy(Policy):
    """Rendezvous hashing of the prompt's first tokens, skipping workers over the
    bounded-load cap; the rest follow in hash order."""

    name = "consistent_hash"

    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> RouteDecision:
        """The hash's first worker under the cap, then hash order."""
        _require(workers)
        order = rendezvous_order(request.key, workers, self.weights.hash_prefix_tokens)
        first = bounded_load_pick(order, self.weights.load_cap_factor)
        return self._decide(request, [first, *(view for view in order if view is not first)])


class RandomPolicy(Policy):
    """A uniformly random order (``seed`` makes it repeatable)."""

    name = "random"

    def __init__(self, weights: PolicyWeights | None = None, seed: int | None = None) -> None:
        super().__init__(weights)
        self._rng = random.Random(seed)

    def choose(self, request: RouteRequest, workers: Sequence[WorkerView]) -> RouteDecision:
        """A uniformly random permutation."""
        _require(workers)
        return self._decide(request, self._rng.sample(list(workers), len(workers)))


POLICIES: Mapping[str, type[Policy]] = MappingProxyType({
    policy.name: policy
    for policy in (CacheAwarePolicy, RoundRobinPolicy, LeastLoadPolicy, ConsistentHashPolicy, RandomPolicy)
})
DEFAULT_POLICY = CacheAwarePolicy.name


def make_policy(name: str = DEFAULT_POLICY, weights: Mapping[str, float] | None = None) -> Policy:
    """A new policy by registry name with ``weights`` over the defaults (see
    ``PolicyWeights``); ValueError naming an unknown policy or weight."""
    policy = POLICIES.get(name)
    if policy is None:
        raise ValueError(f"policy.name: unknown routing policy {name!r}; known: {', '.join(POLICIES)}")
    return policy(PolicyWeights.from_mapping(weights or {}))
