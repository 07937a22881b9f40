"""Which workers serve a request: the pipeline's *decide* step.

``Decider.candidates`` says who may serve it (its model's ready workers, its
adapter's, its canary pool's); ``Decider.decide`` picks among them: it walks the index once per namespace in use (``match``), ranks the
workers by the policy's cost (``choose``) and, in a fleet with prefill and decode
roles, runs the prefill leg on the best prefill worker (``_prefill_leg``); in a fleet
whose workers pull from each other (``router.sources``), the policy weighs what a
pull would save each worker, and the chosen worker is sent with a peer's hold of the
blocks it lacks when a pull beats restoring and recomputing them (``_peer_source``).
It is one value, ``Decision``. What deciding changes in the router's own state (the
in-flight count, the index's speculative entry, the siblings' routed stream, the
adapter's residency) is one call, ``Decider.commit``, made for every attempt the
moment it is sent, prefill legs included.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from types import MappingProxyType
from typing import Any, NamedTuple

from radix.api_errors import ApiError
from radix.keys import TOKEN_BYTES
from router.canary.controller import Canary
from router.canary.guards import GuardWindow
from router.config import PDConfig
from router.fleet.registry import WorkerRegistry, WorkerState
from router.fleet.worker_state import InFlight
from router.forward.attempt import RETRY_AFTER_S, UpstreamUnavailable
from router.forward.pool import UpstreamError
from router.forward.proxy import Call, Proxy
from router.metrics import RouterMetrics
from router.models import Prompt
from router.routing.index import RouterIndex
from router.routing.load_cost import is_held_up, is_saturated
from router.routing.policy import Policy
from router.routing.sessions import SessionTable, prefer_session
from router.routing.views import RouteRequest
from router.siblings.protocol import Siblings
from router.sources.service import KVSources

log = logging.getLogger(__name__)


class Matches(NamedTuple):
    """What ``Decider.match`` found: tokens of the prompt each worker holds, and of
    those the ones only routed there, not yet reported stored (``routed``), and an
    approximate worker's ones that only this router's requests still before their
    first token vouch for (``unconfirmed``; ``RouterIndex.match_routed``)."""

    tokens: dict[str, int]
    routed: dict[str, int]
    unconfirmed: Mapping[str, int] = MappingProxyType({})

    def num_in_flight_tokens(self, worker_id: str) -> int:
        """Tokens of ``worker_id``'s match that only requests in flight vouch for: what
        the index holds as confirmed is its match less these."""
        return self.routed.get(worker_id, 0) + self.unconfirmed.get(worker_id, 0)


class Ranking(NamedTuple):
    """A request's workers, best first, what each holds, and for a fleet with roles
    (``split_roles``) the workers that take whole requests and those that prefill.
    ``cached``: the tokens each worker would find cached (its match, or what a pull
    planned there would bring: ``Credit.cached``)."""

    ranked: list[WorkerState]
    matches: Matches
    split: tuple[list[WorkerState], list[WorkerState]] | None
    cached: dict[str, int]

    def placeholder(self, prompt: Prompt) -> InFlight:
        """The request counted in flight on the best worker while it is still being
        decided (not sent): with the prompt tokens that worker would prefill, as the
        request is counted once it is sent."""
        best = self.ranked[0]
        num_sent = len(prompt.token_ids)
        return InFlight(best, max(num_sent - self.cached.get(best.worker_id, 0), 0), num_sent)


class Attempt(NamedTuple):
    """One try of a request on one worker, with the ``kv_transfer_params`` it gets."""

    worker: WorkerState
    kv_transfer_params: dict[str, Any] | None


class Candidates(NamedTuple):
    """The workers a request may go to: ``workers`` (a canary pool's, or every ready
    one serving its model and adapter), ``fallback`` (the baseline's, for a canary
    pool's request; else empty) and ``window``, the canary guard window its outcome
    is recorded in (None for a model without pools)."""

    workers: list[WorkerState]
    fallback: list[WorkerState]
    window: GuardWindow | None


@dataclass(frozen=True)
class Decision:
    """Where one request goes. ``ranked``: the workers to try, best first (never
    empty); ``matches``: what the index predicted each holds; ``kv_transfer_params``:
    the prefill leg's answer for ``ranked[0]`` (None: served aggregated), whose blocks
    ``prefill`` holds until they are pulled or released (a prefill worker, or a peer
    holding blocks ``ranked[0]`` lacks)."""

    ranked: list[WorkerState]
    matches: Matches
    kv_transfer_params: dict[str, Any] | None
    prefill: WorkerState | None = None

    def attempts(self) -> list[Attempt]:
        """The tries in order: each ranked worker once, except that a decode worker
        given pulled blocks is tried again without them when the pull fails (it then
        computes the whole prompt) before the next worker."""
        rest = [Attempt(worker, None) for worker in self.ranked]
        if self.kv_transfer_params is None:
            return rest
        return [Attempt(self.ranked[0], self.kv_transfer_params), *rest]


class Decider:
    """Decides where requests go and records each decision. Holds only what deciding
    needs: the index, the policy, the registry, the canary pools, the siblings, the
    proxy (for prefill legs), the PD settings, the router's counters, the source
    planner (None: no worker pulls from a peer) and the sessions' workers (None:
    sessions are not sticky)."""

    def __init__(self, index: RouterIndex, policy: Policy, registry: WorkerRegistry,
                 canary: Canary, siblings: Siblings, proxy: Proxy, pd: PDConfig,
                 max_attempts: int, metrics: RouterMetrics,
                 request_limit: Callable[[WorkerState, int], int | None],
                 sources: KVSources | None = None,
                 sessions: SessionTable | None = None) -> None:
        self._index, self._policy, self._registry = index, policy, registry
        self._canary, self._siblings, self._proxy = canary, siblings, proxy
        self._pd, self._max_attempts, self._metrics = pd, max_attempts, metrics
        self._request_limit = request_limit
        self._sources = sources
        self._sessions = sessions

    def candidates(self, model: str, call: Call) -> Candidates:
        """Who may serve ``call`` to base model ``model``: the ready workers serving
        it (only those that registered ``call.adapter``, for an adapter request),
        narrowed to the canary pool the request falls in, if the model has pools."""
        workers = self._registry.routable(model)
        if call.adapter is not None:
            workers = [w for w in workers if call.adapter in w.lora.adapters]
        route = self._canary.route(model, workers, call.scope, call.prompt.key)
        if route is None:
            return Candidates(workers, [], None)
        return Candidates(route.workers, route.fallback, route.window)

    def rank(self, candidates: Candidates, call: Call) -> Ranking:
        """``call``'s workers among ``candidates``, best first (a canary pool's request
        may fall back to the baseline), with what each holds. ``ApiError`` 503
        (``no_worker`` or ``saturated``, with Retry-After) when no worker can take it
        now. Changes nothing."""
        started = time.monotonic()
        workers = candidates.workers
        matches = self.match(workers, call.prompt, call.scope, call.adapter)
        split = split_roles(workers)
        takers = workers if split is None else split[0]
        weighed, cached = matches, matches.tokens
        if split is None and self._sources is not None:  # a pull's saving counts
            credit = self._sources.credit(takers, matches.tokens, call)
            weighed, cached = matches._replace(tokens=credit.tokens), credit.cached
        ranked = self._sticky(self.choose(takers, weighed, call, candidates.fallback), takers,
                              call)
        self._metrics.decision_seconds.observe(time.monotonic() - started)
        return Ranking(ranked, matches, split, cached)

    async def decide(self, candidates: Candidates, call: Call,
                     ranking: Ranking | None = None) -> Decision:
        """The decision for ``call`` among ``candidates``: its ``ranking`` (made now
        when None, see ``rank``) and, in a fleet with prefill and decode roles, the
        prefill leg's answer. While it waits for a peer's hold, the chosen worker counts
        the request in flight with the tokens it would prefill once the pull lands (the
        flow controller's reservation when that ranked it, else one of its own), so a
        burst decided meanwhile sees it there."""
        reserved = ranking is not None
        ranking = ranking or self.rank(candidates, call)
        ranked, matches, split = ranking.ranked, ranking.matches, ranking.split
        params, prefill = None, None
        if split is not None:
            params, prefill = await self._prefill_leg(call, ranked[0], split[1], matches)
        elif self._sources is not None:
            reservation = None if reserved else ranking.placeholder(call.prompt)
            try:
                params, prefill, matches = await self._peer_source(call, ranked[0],
                                                                   candidates.workers, matches)
            finally:
                if reservation is not None:
                    reservation.end()
        return Decision(ranked, matches, params, prefill)

    def match(self, workers: list[WorkerState], prompt: Prompt, scope: str,
              adapter: str | None) -> Matches:
        """Tokens of the prompt each worker holds in the namespace of ``adapter`` (the
        base model's for None), by one walk per namespace in use; for an engine that
        reuses whole blocks only (vLLM: ``cache_block_size``), what it will reuse: whole
        blocks, and never the prompt's last token (it computes that one)."""
        matched: dict[str, int] = {}
        routed: dict[str, int] = {}
        unconfirmed: dict[str, int] = {}
        by_namespace: dict[str, list[str]] = {}
        for w in workers:
            namespace = w.lora.namespace(adapter, w.namespace)
            if namespace is not None:
                by_namespace.setdefault(namespace, []).append(w.worker_id)
        for namespace, worker_ids in by_namespace.items():
            found, found_routed, found_unconfirmed = self._index.match_routed(
                namespace, prompt.key, scope)
            matched.update((i, found[i]) for i in worker_ids if i in found)
            routed.update((i, found_routed[i]) for i in worker_ids if i in found_routed)
            if found_unconfirmed:
                unconfirmed.update((i, found_unconfirmed[i]) for i in worker_ids
                                   if i in found_unconfirmed)
        for worker in workers:
            if worker.cache_block_size is not None and worker.worker_id in matched:
                _round_to_blocks(matched, (routed, unconfirmed), worker, len(prompt.token_ids))
        return Matches(matched, routed, unconfirmed)

    def choose(self, workers: list[WorkerState], matches: Matches, call: Call,
               fallback: list[WorkerState]) -> list[WorkerState]:
        """The workers to try, best first, at most ``proxy.max_attempts`` of them,
        weighing the load of ``call.adapter`` where it is not resident. Workers whose
        queue is at its bound are left out; when that is every worker the request is
        refused at once (503 ``saturated`` with Retry-After) instead of queueing. A
        canary pool's request (``fallback``: the baseline's workers) keeps its last
        attempt for the least busy baseline worker, and goes to the baseline (ranked by
        the baseline's own matches) when its pool is saturated: a pool never fails a
        request the baseline could serve."""
        if not workers:
            raise ApiError(503, "no ready worker serves this model", code="no_worker",
                           headers={"Retry-After": RETRY_AFTER_S})
        load_ms = self._policy.weights.default_adapter_load_ms
        views = [w.view(matches.tokens.get(w.worker_id, 0), matches.routed.get(w.worker_id, 0),
                        call.adapter, load_ms, self._request_limit(w, call.request.priority))
                 for w in workers]
        views = [v for v in views if not is_saturated(v)]
        if not views and fallback:
            fallback_matches = self.match(fallback, call.prompt, call.scope, call.adapter)
            return self.choose(fallback, fallback_matches, call, [])
        if not views:
            raise ApiError(503, "every worker is saturated; retry later", code="saturated",
                           headers={"Retry-After": RETRY_AFTER_S})
        request = RouteRequest(namespace=workers[0].namespace, key=call.prompt.key,
                               num_prompt_tokens=len(call.prompt.token_ids), scope=call.scope)
        ranked_ids = self._policy.choose(request, views).ranked
        by_id = {w.worker_id: w for w in workers}
        if fallback and self._max_attempts > 1:
            spare = min(fallback, key=attrgetter("num_in_flight_requests"))
            return [by_id[i] for i in ranked_ids[: self._max_attempts - 1]] + [spare]
        return [by_id[i] for i in ranked_ids[: self._max_attempts]]

    def note_session(self, call: Call, worker: WorkerState) -> None:
        """Record that ``worker`` served ``call``'s session (if it names one), for the
        hinted retention or the configured time."""
        if self._sessions is not None and call.session_id is not None:
            self._sessions.note(call.scope, call.session_id, worker.worker_id,
                                call.retention_s)

    def _sticky(self, ranked: list[WorkerState], workers: list[WorkerState], call: Call
                ) -> list[WorkerState]:
        """``ranked`` with the worker that served ``call``'s session last first, while
        it is below the bounded-load cap among ``workers``
        (``router.routing.sessions.prefer_session``)."""
        if self._sessions is None or call.session_id is None:
            return ranked
        worker_id = self._sessions.worker(call.scope, call.session_id)
        sticky = next((w for w in ranked if w.worker_id == worker_id), None)
        return prefer_session(ranked, sticky, _num_active, sum(map(_num_active, workers)),
                              len(workers), self._sessions.config.load_cap_factor)

    def commit(self, worker: WorkerState, key: bytes, scope: str, adapter: str | None,
               num_tokens: int) -> InFlight:
        """Record that ``key`` (under ``scope``, for ``adapter`` or the base model) is
        sent to ``worker`` with ``num_tokens`` to prefill: counted in flight until the
        returned ``InFlight`` ends, noted in the index as a speculative entry, shared
        with the siblings, and (an adapter) made resident there. An approximate
        worker's entry counts as in flight until the request's first token or end
        (``RouterIndex.confirm_routed``, called by ``InFlight.prefilled``)."""
        in_flight = self._registry.begin(worker, num_tokens, len(key) // TOKEN_BYTES)
        if adapter is None:
            namespace = worker.namespace
            self._siblings.routed(worker, key, scope)
        else:
            worker.lora.residency.route(adapter, time.monotonic())
            namespace = worker.lora.namespace(adapter, worker.namespace)
        self._index.note_routed(namespace, worker.worker_id, key, scope, confirmed=False)
        if self._index.is_approximate(worker.worker_id):
            in_flight.on_prefilled = partial(self._index.confirm_routed, namespace,
                                             worker.worker_id, key, scope)
        return in_flight

    async def _prefill_leg(self, call: Call, decode: WorkerState,
                           prefillers: list[WorkerState], matches: Matches
                           ) -> tuple[dict[str, Any] | None, WorkerState | None]:
        """The ``kv_transfer_params`` of a prefill leg for decode worker ``decode``
        (chosen first, by match and load), run on the best prefill worker
        (docs/pd.md); None (served aggregated) when ``decode`` would compute fewer than
        ``pd.min_uncached_tokens`` of the prompt itself, lacks part of its public prefix
        (received blocks are never public, so its consumer would refuse them), or the
        request cannot be split (``n`` > 1, an adapter, a worker that does not speak
        ``/generate``). A leg that fails, finds every prefill worker saturated, or
        answers params naming another transfer endpoint than the one its worker reported
        (``check_endpoint``) gives None too: the decode worker computes the prompt,
        counted as a fallback; so is a hold cap (a worker at it is skipped, one past it
        answers 429). Returns (params, the worker holding their blocks)."""
        counts = self._metrics.pd_requests
        prompt = call.prompt
        candidates = self._prefill_candidates(call, decode, prefillers, matches)
        if not candidates:
            counts["aggregated"].inc()
            return None, None
        try:  # a worker at its hold cap (polled) would refuse the leg: skip it
            prefill = self.choose([w for w in candidates if not is_held_up(
                w.view(0, 0, None, 0.0))], matches, call, [])[0]
        except ApiError as exc:
            log.info("request %s: no prefill worker (%s): decoding whole on %s",
                     call.request_id, exc.code, decode.worker_id)
            counts["fallback"].inc()
            return None, None
        num_tokens = max(len(prompt.token_ids) - matches.tokens.get(prefill.worker_id, 0), 0)
        in_flight = self.commit(prefill, prompt.key, call.scope, None, num_tokens)
        params = None
        try:
            params = await self._proxy.prefill(call, prefill)
            check_endpoint(params, prefill)
        except (UpstreamUnavailable, UpstreamError, ApiError) as exc:
            log.warning("request %s: prefill leg on %s failed (%s): decoding whole on %s",
                        call.request_id, prefill.worker_id, exc, decode.worker_id)
            if params is not None:  # refused params: nobody will pull what they hold
                self._proxy.release_hold(prefill, params)
            if isinstance(exc, UpstreamUnavailable) and exc.worker_down:
                await self._registry.mark_failed(prefill, str(exc))
            counts["fallback"].inc()
            return None, None
        finally:
            in_flight.end()
        counts["disaggregated"].inc()
        return params, prefill

    async def _peer_source(self, call: Call, target: WorkerState,
                           workers: list[WorkerState], matches: Matches
                           ) -> tuple[dict[str, Any] | None, WorkerState | None, Matches]:
        """A peer's hold of the blocks ``target`` lacks when ``router.sources`` plans a
        pull (its params, the peer, and the matches with ``target`` credited what it
        will find cached); params naming another endpoint than the peer reported
        (``check_endpoint``) are released and ``target`` recomputes."""
        assert self._sources is not None
        sourced = await self._sources.source(call, target, workers)
        if sourced.params is None or sourced.peer is None:
            return None, None, matches
        try:
            check_endpoint(sourced.params, sourced.peer)
        except UpstreamError as exc:
            log.warning("request %s: %s: recomputing on %s", call.request_id, exc,
                        target.worker_id)
            self._proxy.release_hold(sourced.peer, sourced.params)
            return None, None, matches
        tokens = {**matches.tokens, target.worker_id: sourced.num_cached_tokens or 0}
        return sourced.params, sourced.peer, matches._replace(tokens=tokens)

    def _prefill_candidates(self, call: Call, decode: WorkerState,
                            prefillers: list[WorkerState], matches: Matches
                            ) -> list[WorkerState]:
        """The workers that may prefill ``call`` for ``decode``: those of its cache
        namespace (``decode`` refuses blocks of any other); none when it is served
        whole (see ``_prefill_leg``)."""
        prompt = call.prompt
        num_decode_matched = matches.tokens.get(decode.worker_id, 0)
        if (len(prompt.token_ids) - num_decode_matched < self._pd.min_uncached_tokens
                or num_decode_matched < prompt.num_public_tokens
                or not decode.capabilities.speaks_generate or call.adapter is not None
                or call.request.sampling.n != 1):
            return []
        return [w for w in prefillers if w is not decode and w.capabilities.speaks_generate
                and w.namespace == decode.namespace]


def check_endpoint(params: dict[str, Any], worker: WorkerState) -> dict[str, Any]:
    """``params`` when their ``remote_host``/``remote_port`` are the transfer endpoint
    ``worker`` reported in ``/info`` under its key; else ``UpstreamError`` (a decode
    worker is never sent to pull from an address a prefill answer chose)."""
    named = (params.get("remote_host"), params.get("remote_port"))
    if worker.transfer_endpoint is None or named != worker.transfer_endpoint:
        raise UpstreamError(f"endpoint_mismatch: worker {worker.worker_id}'s params name "
                            f"{named[0]!r}:{named[1]!r}, it reported "
                            f"{worker.transfer_endpoint!r}")
    return params


def _num_active(worker: WorkerState) -> int:
    """The requests a worker runs or queues: polled, or this router's in flight when
    more."""
    load = worker.load
    return max(load.num_requests_running + load.num_requests_waiting,
               worker.num_in_flight_requests)


def split_roles(workers: list[WorkerState]) -> tuple[list[WorkerState], list[WorkerState]] | None:
    """(the workers that take whole requests and decode legs, those that prefill for
    others) when some worker has a prefill or decode role; None otherwise."""
    if all(w.role == "both" for w in workers):
        return None
    return ([w for w in workers if w.role != "prefill"],
            [w for w in workers if w.role != "decode"])


def _round_to_blocks(matched: dict[str, int], in_flight: tuple[dict[str, int], ...],
                     worker: WorkerState, num_prompt_tokens: int) -> None:
    """``worker``'s match cut to whole blocks of its ``cache_block_size``, never past
    the prompt's last token; its in-flight parts (routed, unconfirmed) stay the match's
    end."""
    block_size = worker.cache_block_size
    assert block_size is not None
    worker_id = worker.worker_id
    reusable = (num_prompt_tokens - 1) // block_size * block_size
    num_tokens = matched[worker_id]
    matched[worker_id] = min(num_tokens // block_size * block_size, reusable)
    for part in in_flight:
        if worker_id in part:
            num_known = num_tokens - part[worker_id]
            part[worker_id] = max(matched[worker_id] - num_known, 0)
