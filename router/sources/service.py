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
and, while it is busy, one of its engine steps (its hold's pin waits for the step
running on its engine thread; its block reads do not, and it computes nothing).
A worker a pull was planned into is a source from then on (``PendingPulls``): for the
same prompt's prefix it is offered as a peer whose blocks arrive when that pull is
predicted to end (``Peer.arrives_s``), and its hold waits for them to start arriving
(``PeerHold.wait_s``): it relays each block as it comes, so a pull from it ends when
its own pull does, or its link's time later when that is longer. So a prefix many
workers pull at once (a fork's sub-agents) spreads down chains of relays in about one
link time, instead of queueing on its first holder's link or doubling its holders
once per link time. A request sent
to a worker whose pull of the prefix is still on its way joins that pull (``join``):
it asks the same peer for a hold (the worker's consumer runs pulls of one chain in
turn, so the later one finds the blocks imported and fetches none), and no link time
is reserved again. A hold that fails, times out or names no block leaves the request
to recompute on the chosen worker, counted as ``pull_failed``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson
from prometheus_client import CollectorRegistry

from radix.keys import TOKEN_BYTES
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
from router.sources.plan import (
    PULL,
    Holding,
    Peer,
    PullRules,
    SourcePlan,
    check_plan,
    plan_sources,
)
from router.sources.planned import PeerLinks, Pending, PendingPulls

log = logging.getLogger(__name__)
PENDING_GRACE_S = 5.0
# The share of the hold's timeout that a hold on a worker still receiving the blocks
# may wait for them (the rest is left for its answer).
HOLD_WAIT_SHARE = 0.8
# The share of a peer's engine step a hold's pin waits for: the rest of the step in
# progress when it arrives, half of one on average while steps run back to back.
STEP_IN_PROGRESS_SHARE = 0.5


class Credit(NamedTuple):
    """What a pull would give each worker that could pull (``KVSources.credit``):
    ``tokens``, its match raised by the pull's saving (what the policy weighs: the
    pulled span less its pull time in tokens of recompute), and ``cached``, what it
    would find cached once the pull lands (what its engine would still prefill is the
    rest: the pull's wait is time, not work queued on its engine)."""

    tokens: dict[str, int]
    cached: dict[str, int]


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
        self.pending = PendingPulls(PENDING_GRACE_S)
        self.rules = PullRules(config.min_pull_tokens, config.pull_overhead_s)
        self._costs: dict[str, tuple[Mapping[str, Any], SourceCosts | None]] = {}

    def credit(self, workers: list[WorkerState], tokens: dict[str, int], call: Call
               ) -> Credit:
        """``tokens`` (each worker's match) with every worker that could pull raised
        to ``SourcePlan.credited_tokens`` of its best plan (``Credit.tokens``; the same
        dict when none could), and to what it would find cached with that plan
        (``Credit.cached``). Changes nothing."""
        credited = cached = tokens
        holdings: dict[str, dict[str, Holding]] = {}
        for worker in workers:
            costs = self._pulls_for(worker, call)
            if costs is None:
                continue
            plan = self._plan(worker, workers, call, costs, holdings)
            if plan.peer is not None:
                if credited is tokens:
                    credited, cached = dict(tokens), dict(tokens)
                matched = tokens.get(worker.worker_id, 0)
                credited[worker.worker_id] = max(matched, int(plan.credited_tokens()))
                cached[worker.worker_id] = max(matched, plan.num_cached_tokens)
        return Credit(credited, cached)

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
        end = own + plan.num_pulled_tokens
        coming = self._arrivals_s(peer, call)
        if plan.source == PULL:  # a relay's link is busy until the last block came by too
            self.links.reserve(peer.worker_id, max(costs.transfer_s(plan.num_pulled_tokens),
                                                   self._peer_costs(peer).transfer_s(
                                                       plan.num_pulled_tokens)),
                               max(coming, default=0.0))
        assert plan.pull_s is not None
        pending = None
        if plan.source == PULL:  # before the hold: requests decided meanwhile join it
            pending = Pending(target.worker_id, target.namespace or "", call.scope,
                              call.prompt.key[: end * TOKEN_BYTES],
                              time.monotonic() + plan.pull_s, peer.worker_id)
            self.pending.add(pending)
        block_size = self._block_size(target)
        params = await self._hold(call, peer, end // block_size,
                                  HOLD_WAIT_SHARE * self._config.hold_timeout_s if coming else 0.0)
        if params is None:
            if pending is not None:
                self.pending.discard(pending)
            self.metrics.plans[PULL_FAILED].inc()
            return Sourced()
        held = len(params["remote_block_hashes"]) * block_size
        return Sourced(params, peer, max(own, held))

    def _arrivals_s(self, peer: WorkerState, call: Call) -> list[float]:
        """Seconds until each planned pull of the prompt's prefix into ``peer`` is
        predicted there (none: ``peer`` stores what it sends). A hold on a peer with
        one may wait most of ``hold_timeout_s`` for the blocks: it answers as soon as
        they come (or start coming: a relay), and a pull late against its prediction (a
        busy link, a busy engine) must not turn a hold into a recompute of the whole
        prefix."""
        now = time.monotonic()
        return [p.ready_at - now for p in self.pending.holders(
            peer.namespace or "", call.scope, call.prompt.key) if p.worker_id == peer.worker_id]

    def _plan(self, target: WorkerState, workers: list[WorkerState], call: Call,
              costs: SourceCosts, holdings: dict[str, dict[str, Holding]]) -> SourcePlan:
        """``target``'s plan among the peers of its namespace holding the longest
        stored chains and the workers a pull of the prefix is on its way to
        (``max_peers`` of each; of equal chains, those whose link is free first, so the
        pulls of a fork spread over every worker that has its prefix), and the pull on
        its way to ``target`` itself (to join); ``holdings`` caches the index walk per
        namespace."""
        namespace = target.namespace or ""
        if namespace not in holdings:
            found = self._index.match_tiers(NamespaceDigest(namespace), call.prompt.key,
                                            call.scope)
            holdings[namespace] = {w: Holding(*chains) for w, chains in found.items()}
        held = holdings[namespace]
        others = {w.worker_id: w for w in workers
                  if w is not target and w.namespace == namespace and self._serves(w)}
        stored = sorted((i for i in others if i in held),
                        key=lambda i: (-held[i].any_tier, self.links.wait_s(i)))[: self._config.max_peers]
        peers = [self._peer(others[i], held[i].any_tier) for i in stored]
        now = time.monotonic()
        pending = self.pending.holders(namespace, call.scope, call.prompt.key)
        joined = max((p for p in pending if p.worker_id == target.worker_id
                      and p.source in others), key=lambda p: len(p.key), default=None)
        if joined is not None:
            peers.append(Peer(joined.source, len(joined.key) // TOKEN_BYTES,
                              max(0.0, joined.ready_at - now),
                              self._peer_costs(others[joined.source]), joins=True))
        coming = sorted((p for p in pending if p.worker_id in others and p.worker_id not in stored),
                        key=lambda p: (-len(p.key), p.ready_at + self.links.wait_s(p.worker_id)))
        seen: set[str] = set()
        for pending in coming:
            if pending.worker_id not in seen and len(seen) < self._config.max_peers:
                seen.add(pending.worker_id)
                peers.append(self._peer(others[pending.worker_id], len(pending.key) // TOKEN_BYTES,
                                        max(0.0, pending.ready_at - now)))
        return plan_sources(held.get(target.worker_id, Holding(0, 0)), peers,
                            len(call.prompt.token_ids), call.prompt.num_public_tokens,
                            self._block_size(target), costs, self.rules)

    def _peer(self, worker: WorkerState, num_tokens: int, arrives_in_s: float = 0.0) -> Peer:
        """``worker`` as a source of ``num_tokens`` (all there in ``arrives_in_s``: it
        relays them as they come): its wait is its link's queue and the rest of the
        engine step in progress (``STEP_IN_PROGRESS_SHARE`` of one as its load says:
        the hold's pin of what it caches waits for it). A worker still receiving the
        blocks holds them before the requests waiting for the same pull reach its
        engine: only the load it reported (what its engine runs) counts then, not this
        router's requests sent there."""
        costs = self._peer_costs(worker)
        load = worker.load
        num_running, num_waiting = load.num_requests_running, load.num_waiting_tokens
        if not arrives_in_s:
            num_running = max(num_running, worker.num_in_flight_requests)
            num_waiting = max(num_waiting, worker.num_in_flight_prompt_tokens)
        wait_s = (self.links.wait_s(worker.worker_id)
                  + STEP_IN_PROGRESS_SHARE * costs.step_s(num_running, num_waiting, num_tokens))
        return Peer(worker.worker_id, num_tokens, wait_s, costs, arrives_s=arrives_in_s)

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
        tokens["pulled" if plan.source == PULL else "joined"].inc(plan.num_pulled_tokens)
        tokens["recomputed"].inc(plan.num_recomputed_tokens)

    async def _hold(self, call: Call, peer: WorkerState, max_blocks: int, wait_s: float
                    ) -> dict[str, Any] | None:
        """The params of ``peer``'s hold of the prompt's first ``max_blocks`` blocks for
        ``call``'s scope (waiting up to ``wait_s`` for blocks on their way to it); None
        (logged) when it fails, times out or holds nothing."""
        prompt = call.prompt
        body = PeerHold(prompt.key, call.scope, prompt.num_public_tokens, max_blocks,
                        wait_s).to_json()
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
            if not isinstance(params, dict) or not params.get("remote_block_hashes"):
                raise UpstreamError("the hold names no block")
        except (UpstreamError, TimeoutError, OSError, ValueError, KeyError, TypeError) as exc:
            log.info("request %s: no hold on %s (%s): recomputing", call.request_id,
                     peer.worker_id, exc)
            return None
        return params
