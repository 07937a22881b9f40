"""``KVSources``: where the blocks a chosen worker lacks come from, for the decide step.

For a request a worker can pull for (it reported ``consumer`` and its costs in
``/info``, speaks ``/generate``; base model, ``n`` 1), ``credit`` raises each such
worker's match by what a pull would save it, so the policy routes for load and cache
alike (a worker lacking a long prefix that a peer holds is nearly as good as the
peer); ``source`` then plans the chosen worker's spans (``router.sources.plan``) from
the index's stored chains (``RouterIndex.match_tiers``: never a speculative entry,
so a peer is only asked for blocks it reported stored) and, for a planned pull, asks
the peer to hold them (``POST /kv_transfer/hold``: it runs nothing) and returns the
``kv_transfer_params`` it answers, which the chosen worker pulls with before it runs.

A peer's wait is what this router knows of it: the link time of the pulls it planned
from it that have not crossed yet (``PeerLinks``: one link per peer, pulls in turn)
and, while it is busy, two of its engine steps (its hold's pin and its block reads
each wait for the step running on its engine thread; it computes nothing for a pull).
A hold that fails, times out or names no block leaves the request to recompute on the
chosen worker, counted as ``pull_failed``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from radix.kv_sources import SourceCosts
from radix.kv_transfer import HOLD_PATH, PeerHold
from router.config import KVSourcesConfig
from router.fleet.registry import WorkerState
from router.forward.pool import UpstreamError, UpstreamPool
from router.forward.proxy import (
    PREFILL_ANSWER_BASE_BYTES,
    PREFILL_ANSWER_BYTES_PER_TOKEN,
    Call,
    read_bounded,
)
from router.routing.index import NamespaceDigest, RouterIndex
from router.routing.load_cost import is_held_up
from router.sources.metrics import PULL_FAILED, SourceMetrics
from router.sources.plan import Holding, Peer, PullRules, SourcePlan, check_plan, plan_sources

log = logging.getLogger(__name__)


class PeerLinks:
    """When each peer's outgoing link is free of the pulls this router planned from
    it (monotonic seconds): a new pull waits for those before its own bytes cross."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._free_at: dict[str, float] = {}

    def wait_s(self, worker_id: str) -> float:
        """Seconds until ``worker_id``'s link is free of the pulls planned so far."""
        return max(0.0, self._free_at.get(worker_id, 0.0) - self._clock())

    def reserve(self, worker_id: str, seconds: float) -> None:
        """Queue a pull of ``seconds`` on ``worker_id``'s link."""
        now = self._clock()
        self._free_at[worker_id] = max(now, self._free_at.get(worker_id, now)) + seconds


@dataclass(frozen=True)
class Sourced:
    """What ``KVSources.source`` decided for the chosen worker: the params of the
    peer's hold to pull with and the peer holding them (None, None: no pull), and the
    tokens the worker will find cached (None: as matched)."""

    params: dict[str, Any] | None = None
    peer: WorkerState | None = None
    num_cached_tokens: int | None = None


class KVSources:
    """Plans sources and asks peers for holds (module docstring)."""

    def __init__(self, index: RouterIndex, config: KVSourcesConfig, pool: UpstreamPool,
                 registry: CollectorRegistry, links: PeerLinks | None = None) -> None:
        self._index, self._config, self._pool = index, config, pool
        self.metrics = SourceMetrics(registry)
        self.links = links or PeerLinks()
        self.rules = PullRules(config.min_pull_tokens, config.pull_overhead_s)
        self._costs: dict[str, tuple[Mapping[str, Any], SourceCosts | None]] = {}

    def credit(self, workers: list[WorkerState], tokens: dict[str, int], call: Call
               ) -> dict[str, int]:
        """``tokens`` (each worker's match) with every worker that could pull raised
        to ``SourcePlan.credited_tokens`` of its best plan; the same dict when none
        could. Changes nothing."""
        credited = tokens
        holdings: dict[str, dict[str, Holding]] = {}
        for worker in workers:
            costs = self._pulls_for(worker, call)
            if costs is None:
                continue
            plan = self._plan(worker, workers, call, costs, holdings)
            if plan.peer is not None:
                if credited is tokens:
                    credited = dict(tokens)
                credited[worker.worker_id] = max(tokens.get(worker.worker_id, 0),
                                                 int(plan.credited_tokens()))
        return credited

    async def source(self, call: Call, target: WorkerState, workers: list[WorkerState]
                     ) -> Sourced:
        """The plan for ``target`` (chosen among ``workers``), counted; for a pull, the
        peer's hold. Never raises for a failed hold: the worker recomputes then."""
        costs = self._pulls_for(target, call)
        if costs is None:
            return Sourced()
        plan = self._plan(target, workers, call, costs, {})
        if (broken := check_plan(plan, self.rules)) is not None:  # never sent
            self.metrics.broken_rules.inc()
            log.error("request %s: a pull plan %s: %s", call.request_id, broken, plan)
            return Sourced()
        self._count(plan)
        if plan.peer is None:
            return Sourced()
        peer = next(w for w in workers if w.worker_id == plan.peer)
        own = plan.num_local_tokens + plan.num_restored_tokens
        self.links.reserve(peer.worker_id, max(costs.transfer_s(plan.num_pulled_tokens),
                                               self._peer_costs(peer).transfer_s(
                                                   plan.num_pulled_tokens)))
        block_size = self._block_size(target)
        params = await self._hold(call, peer, (own + plan.num_pulled_tokens) // block_size)
        if params is None:
            self.metrics.plans[PULL_FAILED].inc()
            return Sourced()
        held = len(params["remote_block_ids"]) * block_size
        return Sourced(params, peer, max(own, held))

    def _plan(self, target: WorkerState, workers: list[WorkerState], call: Call,
              costs: SourceCosts, holdings: dict[str, dict[str, Holding]]) -> SourcePlan:
        """``target``'s plan among the peers of its namespace holding the longest
        stored chains (``max_peers``); ``holdings`` caches the index walk per
        namespace."""
        namespace = target.namespace or ""
        if namespace not in holdings:
            found = self._index.match_tiers(NamespaceDigest(namespace), call.prompt.key,
                                            call.scope)
            holdings[namespace] = {w: Holding(*chains) for w, chains in found.items()}
        held = holdings[namespace]
        peers = sorted((w for w in workers if w is not target and w.namespace == namespace
                        and w.worker_id in held and self._serves(w)),
                       key=lambda w: -held[w.worker_id].any_tier)[: self._config.max_peers]
        return plan_sources(held.get(target.worker_id, Holding(0, 0)),
                            [self._peer(w, held[w.worker_id].any_tier) for w in peers],
                            len(call.prompt.token_ids), call.prompt.num_public_tokens,
                            self._block_size(target), costs, self.rules)

    def _peer(self, worker: WorkerState, num_tokens: int) -> Peer:
        costs = self._peer_costs(worker)
        load = worker.load
        busy = (load.num_requests_running + load.num_requests_waiting
                + worker.num_in_flight_requests) > 0
        wait_s = self.links.wait_s(worker.worker_id) + (2 * costs.busy_step_s() if busy else 0.0)
        return Peer(worker.worker_id, num_tokens, wait_s, costs)

    def _serves(self, worker: WorkerState) -> bool:
        """A peer may send: it reported a transfer endpoint and costs, speaks
        ``/generate``, and is below its cap on held blocks."""
        return (worker.transfer_endpoint is not None and worker.capabilities.speaks_generate
                and self._costs_of(worker) is not None
                and not is_held_up(worker.view(0, 0, None, 0.0)))

    def _pulls_for(self, worker: WorkerState, call: Call) -> SourceCosts | None:
        """``worker``'s costs when it may pull for ``call`` (it consumes, speaks
        ``/generate``; base model, one choice); else None."""
        info = worker.transfer_info
        if (info is None or info.get("consumer") is not True or call.adapter is not None
                or call.request.sampling.n != 1 or not worker.capabilities.speaks_generate):
            return None
        return self._costs_of(worker)

    def _peer_costs(self, worker: WorkerState) -> SourceCosts:
        costs = self._costs_of(worker)
        assert costs is not None
        return costs

    def _costs_of(self, worker: WorkerState) -> SourceCosts | None:
        """``worker``'s reported costs with the configured defaults (parsed once per
        report; None, logged once, when malformed or absent)."""
        info = worker.transfer_info
        reported = info.get("costs") if info is not None else None
        if not isinstance(reported, Mapping):
            return None
        cached = self._costs.get(worker.worker_id)
        if cached is not None and cached[0] is reported:
            return cached[1]
        try:
            costs: SourceCosts | None = SourceCosts.parse(reported,
                                                          self._config.rate_defaults())
        except ValueError as exc:
            log.warning("worker %s reports unusable KV costs: %s", worker.worker_id, exc)
            costs = None
        self._costs[worker.worker_id] = (reported, costs)
        return costs

    @staticmethod
    def _block_size(worker: WorkerState) -> int:
        return worker.cache_namespace.block_size if worker.cache_namespace else 16

    def _count(self, plan: SourcePlan) -> None:
        self.metrics.plans[plan.source].inc()
        tokens = self.metrics.tokens
        tokens["local"].inc(plan.num_local_tokens)
        tokens["restored"].inc(plan.num_restored_tokens)
        tokens["pulled"].inc(plan.num_pulled_tokens)
        tokens["recomputed"].inc(plan.num_recomputed_tokens)

    async def _hold(self, call: Call, peer: WorkerState, max_blocks: int
                    ) -> dict[str, Any] | None:
        """The params of ``peer``'s hold of the prompt's first ``max_blocks`` blocks for
        ``call``'s scope; None (logged) when it fails, times out or holds nothing."""
        prompt = call.prompt
        body = PeerHold(prompt.key, call.scope, prompt.num_public_tokens, max_blocks).to_json()
        max_bytes = PREFILL_ANSWER_BASE_BYTES + PREFILL_ANSWER_BYTES_PER_TOKEN * len(
            prompt.token_ids)
        try:
            async with asyncio.timeout(self._config.hold_timeout_s):
                response = await self._pool.post(peer.url, HOLD_PATH, peer.headers, body)
                try:
                    raw = await read_bounded(response, max_bytes)
                finally:
                    response.close()
            if response.status != 200:
                raise UpstreamError(f"HTTP {response.status}: {raw[:200]!r}")
            params = orjson.loads(raw)["kv_transfer_params"]
            if not isinstance(params, dict) or not params.get("remote_block_ids"):
                raise UpstreamError("the hold names no block")
        except (UpstreamError, TimeoutError, OSError, ValueError, KeyError, TypeError) as exc:
            log.info("request %s: no hold on %s (%s): recomputing", call.request_id,
                     peer.worker_id, exc)
            return None
        return params
