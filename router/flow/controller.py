"""``FlowController``: the pipeline's *queue* step. A request waits here until a worker
has headroom and fairness lets it go; ``NoFlowControl`` is the step without a queue.

``turn`` returns a ``Turn``: the ranking the dispatcher made for the request (its
workers with headroom, best first) and a reservation that counts it in flight on its
best worker from the moment it was let go until the request commits its first
attempt (``Turn.release``), so a burst of grants in one pass sees each other. A
request goes straight on when nothing waits and a worker has headroom; otherwise it
is queued (``FairQueue``) and a dispatcher task, woken by arrivals, by requests that
end (``wake``) and every ``TICK_S`` while anything waits, lets requests go in fair
order. Among the first ``locality_window`` that can go now, it picks the one whose
best worker holds most of its prompt: locality within a bound fairness sets.

A request that waits past its band's ``queue_ttl_s`` is shed: 429 with Retry-After
from the recent dispatch rate. So is a new one when ``max_queued_requests`` wait. A
client that leaves while queued is removed at once; nothing is sent for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry

from radix.api_errors import ApiError
from router.config import FlowConfig
from router.decision import Candidates, Decider, Ranking
from router.fleet.worker_state import InFlight
from router.flow.fair_queue import Entry, FairQueue
from router.flow.headroom import RequestLimit, has_headroom
from router.flow.metrics import FlowMetrics
from router.flow.served import ServedWindow
from router.flow.shares import FlowShares
from router.forward.proxy import Call
from router.front.auth import Tenant
from router.tasks import cancel_and_wait

log = logging.getLogger(__name__)
TICK_S = 0.05
FAIRNESS_WINDOW_S = 30.0
_RATE_LIFETIME_S = 5.0
_MAX_RETRY_AFTER_S = 60
_NOWHERE: Mapping[str, float] = {}


@dataclass
class Turn:
    """A request let go: ``ranking`` (None: the decider ranks it itself) and the
    reservation holding its place on its best worker until ``release``."""

    ranking: Ranking | None = None
    reservation: InFlight | None = None

    def release(self) -> None:
        """Give the reservation back (idempotent): call when the request's own in-flight
        count has taken over, or when it will not be sent."""
        if self.reservation is not None:
            self.reservation.end()
            self.reservation = None


@dataclass(frozen=True)
class FlowRequest:
    """What flow control knows of a request: who may serve it, the call, its tenant,
    band, fairness id, weight and token cost."""

    candidates: Candidates
    call: Call
    tenant_id: str
    band: int
    flow: str
    weight: float
    cost: float


@dataclass(eq=False)
class _Waiter:
    request: FlowRequest
    granted: asyncio.Future[Turn] = field(default_factory=asyncio.Future)


class NoFlowControl:
    """The queue step when flow control is off: every request goes straight on."""

    async def turn(self, candidates: Candidates, call: Call, tenant: Tenant,
                   fairness_key: str | None) -> Turn:
        """An empty turn at once: the decider ranks the request itself."""
        return Turn()

    def wake(self) -> None:
        """Nothing waits."""

    async def close(self) -> None:
        """Nothing to stop."""


class FlowController:
    """Flow control (see the module docstring)."""

    def __init__(self, config: FlowConfig, decider: Decider, limit: RequestLimit,
                 registry: CollectorRegistry | None = None,
                 shares: FlowShares | None = None) -> None:
        """``registry``: where the metrics go (None: no metrics, for tests);
        ``shares``: what other routers served per fairness id (None: none)."""
        self._config = config
        self._decider, self._limit = decider, limit
        self._queue: FairQueue[_Waiter] = FairQueue(len(config.bands), config.aging_s)
        self._ttl_s = [band.queue_ttl_s for band in config.bands]
        self._names = [band.name for band in config.bands]
        self._served = ServedWindow(FAIRNESS_WINDOW_S)
        self._metrics = None if registry is None else FlowMetrics(
            registry, self._names, self._queue.num_queued, self.jain_index)
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._shares = shares
        self._share_task: asyncio.Task[None] | None = None
        self._num_recent, self._recent_at = 0.0, time.monotonic()

    def jain_index(self) -> float:
        """Jain's index of the weighted tokens dispatched over the recent window."""
        return self._served.jain_index(time.monotonic())

    async def turn(self, candidates: Candidates, call: Call, tenant: Tenant,
                   fairness_key: str | None) -> Turn:
        """Wait for the turn of ``call`` from ``tenant`` among ``candidates`` (see the
        module docstring); ``fairness_key`` (the configured header's value) splits the
        tenant's share. ApiError 429 when it is shed, 503 ``no_worker`` when no worker
        serves it at all."""
        request = self._request(candidates, call, tenant, fairness_key)
        now = time.monotonic()
        if self._shares is not None and self._share_task is None:
            self._share_task = asyncio.create_task(self._sync_shares(self._shares),
                                                   name="flow shares sync")
        if not request.candidates.workers:
            raise ApiError(503, "no ready worker serves this model", code="no_worker",
                           headers={"Retry-After": "1"})
        if len(self._queue) == 0:
            ranking = self._rank(request, {})
            if ranking is not None:
                return self._grant(request, ranking, now, 0.0)
        if len(self._queue) >= self._config.max_queued_requests:
            raise self._shed(request, "queue_full", "too many requests are waiting")
        waiter = _Waiter(request)
        entry = self._queue.push(waiter, request.band, request.flow, request.cost,
                                 request.weight, now, self._served_elsewhere())
        self.wake()
        try:
            return await self._wait(waiter, entry)
        finally:
            self._queue.remove(entry, dispatched=False)

    def _request(self, candidates: Candidates, call: Call, tenant: Tenant,
                 fairness_key: str | None) -> FlowRequest:
        """What flow control weighs of a request: its band (its ``priority``, which the
        pipeline set to its band's index), its fairness id and its cost in tokens
        (prompt plus expected decode per choice)."""
        sampling = call.request.sampling
        num_decode = self._config.expected_decode_tokens
        if call.max_tokens is not None:
            num_decode = min(num_decode, call.max_tokens)
        cost = len(call.prompt.token_ids) + num_decode * sampling.n
        flow = tenant.tenant_id if fairness_key is None else f"{tenant.tenant_id}/{fairness_key}"
        return FlowRequest(candidates, call, tenant.tenant_id, call.request.priority,
                           flow, tenant.weight, float(max(cost, 1)))

    def wake(self) -> None:
        """Headroom may have appeared (a request ended): run the dispatcher soon."""
        self._wakeup.set()
        if self._task is None and len(self._queue):
            self._task = asyncio.create_task(self._dispatcher(), name="flow dispatcher")

    async def close(self) -> None:
        """Stop the dispatcher and the shares' sync (waiting requests stay until their
        clients or TTLs go)."""
        for task in (self._task, self._share_task):
            if task is not None:
                await cancel_and_wait(task)

    def _served_elsewhere(self) -> Mapping[str, float]:
        return _NOWHERE if self._shares is None else self._shares.served_elsewhere

    async def _sync_shares(self, shares: FlowShares) -> None:
        """Every ``shares.interval_s``: publish what this router dispatched per flow
        over the fairness window, and learn what the others did."""
        while True:
            try:
                await shares.sync(self._served.totals(time.monotonic()))
            except Exception:  # a bug must not end the sync
                log.exception("flow shares sync failed")
            await asyncio.sleep(shares.interval_s)

    async def _wait(self, waiter: _Waiter, entry: Entry[_Waiter]) -> Turn:
        request = waiter.request
        ttl_s = self._ttl_s[request.band]
        try:
            done, _ = await asyncio.wait({waiter.granted}, timeout=ttl_s)
        except asyncio.CancelledError:
            if waiter.granted.done():
                waiter.granted.result().release()
                self.wake()
            elif self._metrics is not None:
                self._metrics.cancelled.labels(self._names[request.band]).inc()
            raise
        if done:
            return waiter.granted.result()
        waiter.granted.cancel()
        raise self._shed(request, "ttl", f"waited {ttl_s:g} s in band "
                                         f"{self._names[request.band]!r}")

    async def _dispatcher(self) -> None:
        try:
            while len(self._queue):
                self._wakeup.clear()
                self._dispatch(time.monotonic())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), TICK_S)
        finally:
            self._task = None

    def _dispatch(self, now: float) -> None:
        """Let requests go while some can: each time the best of the first
        ``locality_window`` that can go now."""
        while len(self._queue):
            window = self._window(now)
            if not window:
                return
            position = max(range(len(window)), key=lambda i: (_cached_share(*window[i]), -i))
            entry, ranking = window[position]
            self._queue.remove(entry, dispatched=True)
            waiter = entry.item
            if waiter.granted.done():
                continue
            waiter.granted.set_result(self._grant(waiter.request, ranking, now,
                                                  now - entry.enqueued_at))

    def _window(self, now: float) -> list[tuple[Entry[_Waiter], Ranking]]:
        """The first ``locality_window`` queued requests, in fair order, that a worker
        with headroom can take now, with their rankings: all of the band the first of
        them is in (locality never lets one band's request pass another's that goes
        first)."""
        window: list[tuple[Entry[_Waiter], Ranking]] = []
        headroom: dict[tuple[int, int], bool] = {}
        band = None
        for entry in self._queue.in_order(now):
            if entry.item.granted.done():
                continue
            if band is not None and entry.band != band:
                break
            ranking = self._rank(entry.item.request, headroom)
            if ranking is None:
                continue
            band = entry.band
            window.append((entry, ranking))
            if len(window) >= self._config.locality_window:
                break
        return window

    def _rank(self, request: FlowRequest, headroom: dict[tuple[int, int], bool]
              ) -> Ranking | None:
        """``request``'s ranking among its workers with headroom for its band; None when
        none has any. ``headroom`` memoizes the check per worker list and band within
        one pass."""
        workers = request.candidates.workers
        key = (id(workers), request.band)
        if key not in headroom:
            headroom[key] = any(has_headroom(w, self._limit, request.band) for w in workers)
        if not headroom[key]:
            return None
        try:
            return self._decider.rank(request.candidates, request.call)
        except ApiError as exc:
            if exc.code != "saturated":
                raise
            headroom[key] = False
            return None

    def _grant(self, request: FlowRequest, ranking: Ranking, now: float,
               waited_s: float) -> Turn:
        """Reserve ``request``'s place on its best worker (one request and its uncached
        prompt tokens) and count the dispatch."""
        reservation = ranking.placeholder(request.call.prompt)
        self._served.add(now, request.flow, request.cost / request.weight)
        self._num_recent = self._recent_dispatches(now) + 1
        self._recent_at = now
        if self._metrics is not None:
            band = self._names[request.band]
            self._metrics.dispatched.labels(band, request.tenant_id).inc()
            self._metrics.queue_seconds.labels(band, request.tenant_id).observe(waited_s)
        return Turn(ranking, reservation)

    def _recent_dispatches(self, now: float) -> float:
        """Dispatches counted with exponential decay (mean lifetime
        ``_RATE_LIFETIME_S``): at a steady rate r it tends to r * lifetime."""
        return self._num_recent * math.exp(-(now - self._recent_at) / _RATE_LIFETIME_S)

    def _shed(self, request: FlowRequest, reason: str, why: str) -> ApiError:
        """The 429 for a shed request, with Retry-After from the queue ahead of it and
        the recent dispatch rate; counted by band and reason."""
        band = self._names[request.band]
        if self._metrics is not None:
            self._metrics.shed.labels(band, reason).inc()
        rate = max(self._recent_dispatches(time.monotonic()) / _RATE_LIFETIME_S, 1e-3)
        retry_after = min(_MAX_RETRY_AFTER_S, max(1, math.ceil(len(self._queue) / rate)))
        return ApiError(429, f"the router is at capacity: {why}; retry later",
                        code="flow_control_" + reason, headers={"Retry-After": str(retry_after)})


def _cached_share(entry: Entry[_Waiter], ranking: Ranking) -> float:
    """How much of the request's prompt its best worker holds."""
    prompt = entry.item.request.call.prompt
    best = ranking.ranked[0].worker_id
    return ranking.matches.tokens.get(best, 0) / max(len(prompt.token_ids), 1)
