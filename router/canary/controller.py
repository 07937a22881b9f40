"""``Canary``: every model's pools, their guards, the guard loop and the metrics.

Dispatch asks ``route`` which pool a request goes to (one dict lookup for a model
without pools) and records its outcome in that pool's ``GuardWindow``. One task per
model with pools checks the windows every ``check_interval_s`` and runs the probe
every ``probe_interval_s``; a guard that trips sets the pool's weight to 0 at once
(``ModelPools.trip``), logs a warning and counts
``router_canary_fallbacks_total{model,pool,reason}``. Requests already sent to the
pool finish there; new conversations go by the remaining weights.
``router_pool_weight{model,pool}`` always shows the weights in force.

Routers that share Redis share each model's weights and trips (``shared_state``):
every change made here, by the admin API or a guard, is handed to ``publish``, and
what another router published arrives through ``adopt``; so a pool one router
drained is drained on all of them, and a router that restarts keeps it drained.

An admin change with ``ttl_s`` goes back by itself (``router.canary.overrides``): a
task sleeps until its deadline, sets the weights it reverts, logs it on the admin log
and hands it to ``publish`` like any other change.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, NamedTuple

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge

from router.canary.guards import GuardWindow, judge
from router.canary.overrides import PendingOverrides, SetBy, log_expiry
from router.canary.pools import ModelPools, Trip
from router.canary.probe import Outputs, divergences, greedy_outputs
from router.config import CanaryConfig, ModelSpec
from router.fleet.probes import ProbeError
from router.fleet.registry import WorkerState
from router.tasks import cancel_and_wait

log = logging.getLogger(__name__)
REASONS = ("error_rate", "ttft_p99", "probe")
PROBE_RESULTS = ("agree", "diverge", "error")
Publish = Callable[[str, dict[str, Any]], Awaitable[None]]


class PoolRoute(NamedTuple):
    """Where one request goes: its pool's workers, the baseline's workers to fall back
    on (empty on the baseline), and the window its outcome is recorded in."""

    workers: list[WorkerState]
    fallback: list[WorkerState]
    window: GuardWindow


class _ModelCanary:
    """One model's pools, guard config, windows and probe prompts."""

    def __init__(self, config: ModelSpec, secret: bytes,
                 probe_prompts: Sequence[Sequence[int]]) -> None:
        self.config: CanaryConfig = config.canary
        self.pools = ModelPools(config.name, config.pools, config.canary.baseline,
                                config.block_size, secret)
        self.workers = {name: pool.workers for name, pool in config.pools.items()}
        self.windows = {name: GuardWindow(config.canary.window_s) for name in config.pools}
        self.probe_prompts = tuple(tuple(p) for p in probe_prompts)
        self.last_probe: dict[str, str] = {}
        self.overrides = PendingOverrides()


class Canary:
    """The canary state of every model with pools (see the module docstring)."""

    def __init__(self, models: Mapping[str, ModelSpec], secret: bytes,
                 encode: Callable[[str, str], list[int]], registry: CollectorRegistry) -> None:
        """``encode(model, text)`` tokenizes a probe prompt for ``model``."""
        self._models = {
            name: _ModelCanary(config, secret,
                               [encode(name, text) for text in config.canary.probe_prompts])
            for name, config in models.items() if config.pools}
        self._weight = Gauge("router_pool_weight", "Traffic weight of each canary pool now "
                             "(0 after a fallback)", ["model", "pool"], registry=registry)
        self._fallbacks = Counter("router_canary_fallbacks", "Pools whose traffic a guard "
                                  "moved to the baseline, by guard", ["model", "pool", "reason"],
                                  registry=registry)
        self._probes = Counter("router_canary_probes", "Quality probes of canary pools "
                               "against the baseline, by result", ["model", "pool", "result"],
                               registry=registry)
        for model in self._models.values():
            self._show_weights(model)
            for pool in model.pools.names:
                if pool != model.pools.baseline:
                    for reason in REASONS:
                        self._fallbacks.labels(model.pools.model, pool, reason)
                    for result in PROBE_RESULTS:
                        self._probes.labels(model.pools.model, pool, result)
        self._tasks: list[asyncio.Task[None]] = []
        self._expiries: set[asyncio.Task[None]] = set()
        self._publish: Publish | None = None

    def route(self, model: str, workers: list[WorkerState], tenant_id: str,
              prompt_key: bytes) -> PoolRoute | None:
        """The pool route of a request for ``model`` among its routable ``workers``;
        None for a model without pools (route among all of them)."""
        canary = self._models.get(model)
        if canary is None:
            return None
        pool, chosen, fallback = canary.pools.split(workers, tenant_id, prompt_key)
        return PoolRoute(chosen, fallback, canary.windows[pool])

    @property
    def models(self) -> tuple[str, ...]:
        """The models with pools."""
        return tuple(self._models)

    def start(self, routable: Callable[[str], list[WorkerState]],
              session: aiohttp.ClientSession, publish: Publish | None = None) -> None:
        """Start each model's guard loop (call inside the event loop); a guard's trip
        is handed to ``publish(model, shared_state(model))``."""
        self._publish = publish
        self._tasks = [asyncio.create_task(self._run(model, routable, session))
                       for model in self._models.values()]

    async def close(self) -> None:
        """Stop the guard loops and forget the overrides still to go back."""
        for task in [*self._tasks, *self._expiries]:
            await cancel_and_wait(task)
        self._tasks = []

    def to_dict(self) -> dict[str, object]:
        """JSON view for ``GET /admin/canary``: per model the baseline and, per pool,
        its weight, workers, trip (or None) and current window."""
        now = time.monotonic()
        return {name: {
            "baseline": model.pools.baseline,
            "pools": {pool: {"weight": weight, "workers": list(model.workers[pool]),
                             "tripped": (None if (trip := model.pools.trips.get(pool)) is None
                                         else trip._asdict()),
                             "window": model.windows[pool].summary(now).to_dict(),
                             "last_probe": model.last_probe.get(pool),
                             "override": model.overrides.to_dict(pool, now)}
                      for pool, weight in model.pools.weights.items()},
        } for name, model in self._models.items()}

    def set_weights(self, model: str, weights: Mapping[str, float], set_by: SetBy,
                    ttl_s: float | None = None) -> Mapping[str, float]:
        """Set pool weights of ``model`` (``ModelPools.set_weights``) for good (``ttl_s``
        None) or for ``ttl_s`` seconds, after which they go back by themselves
        (``router.canary.overrides``; call inside the event loop then); a pool given a
        weight above 0 starts a clean window. KeyError for a model without pools,
        ValueError naming a bad pool or weight. Returns the weights now in force."""
        canary = self._models[model]
        before = canary.pools.weights
        self._apply(canary, weights)
        now = canary.pools.weights
        canary.overrides.record(before, {pool: now[pool] for pool in weights}, ttl_s,
                                time.monotonic(), set_by)
        if ttl_s is not None:
            task = asyncio.create_task(self._expire_after(canary, ttl_s))
            self._expiries.add(task)
            task.add_done_callback(self._expiries.discard)
        return now

    def _apply(self, canary: _ModelCanary, weights: Mapping[str, float]) -> None:
        canary.pools.set_weights(weights)
        for pool, weight in weights.items():
            if weight:
                canary.windows[pool].clear()
        self._show_weights(canary)

    async def _expire_after(self, canary: _ModelCanary, ttl_s: float) -> None:
        """Sleep ``ttl_s``, then let the overrides of ``canary`` due by then go back,
        log them and share the change."""
        deadline = time.monotonic() + ttl_s
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(left)
        model = canary.pools.model
        try:
            expiry = canary.overrides.expire(time.monotonic(), canary.pools.weights)
            refused = None
            if expiry.weights:
                try:
                    self._apply(canary, expiry.weights)
                except ValueError as exc:
                    refused = f"going back was refused: {exc}"
            log_expiry(model, expiry, canary.pools.weights, refused)
            if expiry.weights and refused is None and self._publish is not None:
                await self._publish(model, self.shared_state(model))
        except Exception:  # a bug here must not end the router's other tasks
            log.exception("canary override of model %s: going back failed", model)

    def shared_state(self, model: str) -> dict[str, Any]:
        """What other routers need of ``model``'s pools, as JSON: ``weights`` (pool ->
        weight) and ``trips`` (pool -> [reason, detail]). KeyError without pools."""
        pools = self._models[model].pools
        return {"weights": dict(pools.weights),
                "trips": {pool: list(trip) for pool, trip in pools.trips.items()}}

    def adopt(self, model: str, state: Any) -> bool:
        """Take ``state`` (another router's ``shared_state``) for ``model``; True when
        something changed here. A model without pools here is ignored; ValueError for
        a state this router cannot use (nothing changes then)."""
        canary = self._models.get(model)
        if canary is None:
            return False
        weights, trips = _parse_shared(state)
        before = (canary.pools.weights, dict(canary.pools.trips))
        canary.pools.adopt(weights, trips)
        if (canary.pools.weights, canary.pools.trips) == before:
            return False
        for pool, weight in canary.pools.weights.items():
            if weight and not before[0][pool]:
                canary.windows[pool].clear()
        self._show_weights(canary)
        log.info("model %s canary pools set by another router: weights %s, tripped %s",
                 model, canary.pools.weights, sorted(canary.pools.trips))
        return True

    def _show_weights(self, model: _ModelCanary) -> None:
        for pool, weight in model.pools.weights.items():
            self._weight.labels(model.pools.model, pool).set(weight)

    def _trip(self, model: _ModelCanary, pool: str, trip: Trip) -> None:
        if not model.pools.trip(pool, trip):
            return
        log.warning("canary fallback: model %s pool %s -> weight 0, new requests go to %s: "
                    "%s: %s", model.pools.model, pool, model.pools.baseline, trip.reason,
                    trip.detail)
        self._fallbacks.labels(model.pools.model, pool, trip.reason).inc()
        self._show_weights(model)

    async def _run(self, model: _ModelCanary, routable: Callable[[str], list[WorkerState]],
                   session: aiohttp.ClientSession) -> None:
        loop = asyncio.get_running_loop()
        next_probe = loop.time() + model.config.probe_interval_s
        while True:
            await asyncio.sleep(model.config.check_interval_s)
            try:
                tripped = set(model.pools.trips)
                self._check_windows(model, time.monotonic())
                if loop.time() >= next_probe:
                    await self._probe(model, routable(model.pools.model), session)
                    next_probe = loop.time() + model.config.probe_interval_s
                if set(model.pools.trips) - tripped and self._publish is not None:
                    await self._publish(model.pools.model, self.shared_state(model.pools.model))
            except Exception:  # a bug here must not stop guarding
                log.exception("canary guard loop of model %s failed", model.pools.model)

    def _check_windows(self, model: _ModelCanary, now: float) -> None:
        for pool, weight in model.pools.weights.items():
            if weight and pool != model.pools.baseline:
                trip = judge(model.windows[pool].summary(now), model.config)
                if trip is not None:
                    self._trip(model, pool, trip)

    async def _probe(self, model: _ModelCanary, workers: list[WorkerState],
                     session: aiohttp.ClientSession) -> None:
        """Probe every pool no guard tripped (weight 0 too: a check before traffic)
        against the baseline, on one worker of each (``router.canary.probe``)."""
        first: dict[str, WorkerState] = {}
        for worker in workers:
            first.setdefault(model.pools.pool_of(worker.worker_id), worker)
        baseline = first.get(model.pools.baseline)
        pools = [p for p in model.pools.names
                 if p != model.pools.baseline and p not in model.pools.trips and p in first]
        if baseline is None or not pools:
            return
        try:
            expected = await self._outputs(model, baseline, session)
        except ProbeError as exc:
            log.warning("canary probe of model %s: baseline worker %s failed: %s",
                        model.pools.model, baseline.worker_id, exc)
            return
        for pool in pools:
            try:
                found = divergences(expected, await self._outputs(model, first[pool], session))
            except ProbeError as exc:
                log.warning("canary probe of model %s: pool %s worker %s failed: %s",
                            model.pools.model, pool, first[pool].worker_id, exc)
                self._record_probe(model, pool, "error")
                continue
            if len(found) > model.config.probe_max_diverged:
                self._record_probe(model, pool, "diverge")
                self._trip(model, pool, Trip("probe", (
                    f"{len(found)} of {len(expected)} greedy probe prompts differ from the "
                    f"baseline ({first[pool].worker_id} vs {baseline.worker_id}: "
                    f"{'; '.join(found)})")))
            else:
                self._record_probe(model, pool, "agree")

    def _record_probe(self, model: _ModelCanary, pool: str, result: str) -> None:
        model.last_probe[pool] = result
        self._probes.labels(model.pools.model, pool, result).inc()

    @staticmethod
    async def _outputs(model: _ModelCanary, worker: WorkerState,
                       session: aiohttp.ClientSession) -> Outputs:
        openai_model = (None if worker.capabilities.speaks_generate
                        else worker.served_model or worker.model)
        return await greedy_outputs(session, worker.url, worker.headers, model.probe_prompts,
                                    model.config.probe_max_tokens, model.config.probe_timeout_s,
                                    openai_model)


def _parse_shared(state: Any) -> tuple[dict[str, float], dict[str, Trip]]:
    """(weights, trips) of a shared state; ValueError naming what is malformed."""
    if not isinstance(state, dict) or not isinstance(state.get("weights"), dict):
        raise ValueError("weights: must be an object of pool -> number")
    trips = state.get("trips", {})
    if not isinstance(trips, dict) or not all(
            isinstance(t, list) and len(t) == 2 and all(isinstance(x, str) for x in t)
            for t in trips.values()):
        raise ValueError("trips: must be an object of pool -> [reason, detail]")
    return state["weights"], {pool: Trip(*trip) for pool, trip in trips.items()}
