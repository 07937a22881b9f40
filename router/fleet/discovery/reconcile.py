"""``DiscoveredWorkers``: keeps the registry's discovered workers equal to the pods'
endpoints, one pass at a time.

``want`` hands over the endpoints wanted now (by worker id); a single task compares
them with what discovery registered and changes the registry until they agree:

- an endpoint no longer wanted is drained (``WorkerRegistry.drain``: no new request,
  removed once those in flight end or ``drain_timeout_s`` passed); wanted again while
  draining (a pod flapping Ready), it is resumed;
- an endpoint that changed (a new UID or IP under the same name: the pod was
  replaced) is removed before the new one is added, so no request goes to the old
  address after the new one exists;
- a new endpoint is registered through the same checks as ``POST /admin/workers``
  (``parse_worker``, the key variable named for its id: ``router.fleet.worker_keys``)
  and then probed like any worker before it is routed to.

A pass never waits on a pod: an endpoint without a model label has its model looked
up in a task of its own (``router.fleet.discovery.lookup``) and waits, skipped, until
that answers and wakes a pass; meanwhile deletions and other pods go on. Only pods
whose identity the watcher checked (``pods.refusal``) are handed over, so no key
reaches any other pod. A pod's role label, allowed by ``discovery.roles``, is its
worker's role (docs/pd.md). Pods whose id is taken by a worker from elsewhere, or
whose registration is refused (an unknown model, a bad key), are skipped and counted.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping

import aiohttp

from router.config import RouterConfig, WorkerSpec, default_key_env
from router.config_toml import parse_worker
from router.fleet.discovery.lookup import ModelLookups
from router.fleet.discovery.pods import PodEndpoint
from router.fleet.discovery.status import DiscoveryStatus
from router.fleet.registry import WorkerRegistry
from router.fleet.worker_keys import runtime_key_problem
from router.models import Models
from router.tasks import cancel_and_wait
from router.worker_kinds import WORKER_KINDS, EventSource

log = logging.getLogger(__name__)
FAILED_PASS_RETRY_S = 1.0
MODEL_UNKNOWN = "its /v1/models lists no model of this router (yet)"


class DiscoveredWorkers:
    """The registry side of discovery (see the module docstring). Call ``want`` from
    the event loop; ``close`` stops the task and the drains (the workers stay: the
    registry's own close removes them)."""

    def __init__(self, config: RouterConfig, registry: WorkerRegistry, models: Models,
                 session: aiohttp.ClientSession, status: DiscoveryStatus) -> None:
        self._config = config
        self._discovery = config.discovery
        self._registry = registry
        self._models = models
        self._status = status
        self._wanted: dict[str, PodEndpoint] = {}
        self._added: dict[str, PodEndpoint] = {}
        self._drains: dict[str, asyncio.Task[None]] = {}
        self._skipped: dict[str, str] = {}
        self._wake = asyncio.Event()
        self._lookups = ModelLookups(session, models.names,
                                     config.discovery.request_timeout_s, self._wake.set)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the reconciling task."""
        self._task = asyncio.create_task(self._run())

    def want(self, endpoints: Mapping[str, PodEndpoint]) -> None:
        """The endpoints that should be workers now, by worker id."""
        self._wanted = dict(endpoints)
        self._status.num_pods = len({e.uid for e in endpoints.values()})
        self._wake.set()

    async def close(self) -> None:
        """Stop reconciling, looking up models and draining."""
        if self._task is not None:
            await cancel_and_wait(self._task)
        await self._lookups.close()
        for task in list(self._drains.values()):
            await cancel_and_wait(task)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self._reconcile(self._wanted)
            except Exception:  # a bug here must not end discovery, nor stall it
                log.exception("reconciling discovered workers failed; again in %gs",
                              FAILED_PASS_RETRY_S)
                await asyncio.sleep(FAILED_PASS_RETRY_S)
                self._wake.set()

    async def _reconcile(self, wanted: Mapping[str, PodEndpoint]) -> None:
        for worker_id, added in list(self._added.items()):
            if self._added.get(worker_id) is not added:
                continue  # gone while this pass awaited: its drain ended meanwhile
            endpoint = wanted.get(worker_id)
            registered = self._registry.get(worker_id)
            if registered is None or not registered.discovered:  # removed by an admin
                self._added.pop(worker_id)
                self._drains.pop(worker_id, None)
            elif endpoint is None:
                self._start_drain(worker_id)
            elif endpoint != added:
                await self._remove(worker_id, f"replaced by {endpoint.url} (pod {endpoint.uid})")
            elif worker_id in self._drains:
                await cancel_and_wait(self._drains.pop(worker_id))
                self._registry.resume(worker_id)
                log.info("discovered worker %s ready again", worker_id)
        self._add_new(wanted)

    def _add_new(self, wanted: Mapping[str, PodEndpoint]) -> None:
        """Register every wanted endpoint not yet added whose model is known; never
        waits (a model still looked up leaves its endpoint skipped for now)."""
        self._lookups.keep(wanted)
        self._status.num_skipped = 0
        for worker_id, endpoint in wanted.items():
            if worker_id in self._added:
                continue
            spec, why = self._spec(endpoint)
            if spec is None:
                self._skip(worker_id, why)
                continue
            try:
                self._registry.add(spec, discovered=True)
            except ValueError as exc:
                self._skip(worker_id, str(exc))
                continue
            self._added[worker_id] = endpoint
            self._skipped.pop(worker_id, None)
            self._lookups.forget(worker_id)
            log.info("discovered worker %s at %s (pod %s, model %s)", worker_id, endpoint.url,
                     endpoint.uid, spec.model)

    def _skip(self, worker_id: str, why: str) -> None:
        self._status.num_skipped += 1
        if self._skipped.get(worker_id) != why:
            self._skipped[worker_id] = why
            log.warning("discovered pod endpoint %s not registered: %s", worker_id, why)

    def _start_drain(self, worker_id: str) -> None:
        if worker_id in self._drains:
            return
        log.info("discovered worker %s leaving: draining for at most %gs", worker_id,
                 self._discovery.drain_timeout_s)

        async def drain() -> None:
            await self._registry.drain(worker_id, self._discovery.drain_timeout_s)
            self._added.pop(worker_id, None)
            self._drains.pop(worker_id, None)

        self._drains[worker_id] = asyncio.create_task(drain())

    async def _remove(self, worker_id: str, why: str) -> None:
        task = self._drains.pop(worker_id, None)
        if task is not None:
            await cancel_and_wait(task)
        await self._registry.remove(worker_id)
        self._added.pop(worker_id, None)
        log.info("discovered worker %s removed: %s", worker_id, why)

    def _spec(self, endpoint: PodEndpoint) -> tuple[WorkerSpec | None, str]:
        """(the worker to register, "") or (None, why not); the model from the pod's
        label, else its lookup (started here if none runs, answered later)."""
        taken = self._registry.get(endpoint.worker_id)
        if taken is not None:
            return None, "the id is taken by a worker not from discovery"
        prefix = self._config.admin.worker_key_env_prefix
        own_key = default_key_env(endpoint.worker_id, prefix)
        key_env = self._discovery.api_key_env or (own_key if os.environ.get(own_key) else None)
        key = os.environ.get(key_env) if key_env is not None else None
        model = endpoint.model or self._lookups.model(
            endpoint, {"Authorization": f"Bearer {key}"} if key else {})
        if model is None:
            return None, MODEL_UNKNOWN
        fields = {"id": endpoint.worker_id, "model": model, "url": endpoint.url,
                  "kind": self._discovery.worker_kind, "role": endpoint.role}
        if key_env is not None:
            fields["api_key_env"] = key_env
        events = WORKER_KINDS[self._discovery.worker_kind].events
        if events is EventSource.ZMQ_WHEN_CONFIGURED:
            for name, port in (("kv_events", endpoint.kv_events_port),
                               ("kv_events_replay", endpoint.kv_events_replay_port)):
                if port is not None:
                    fields[name] = endpoint.zmq(port)
        try:
            spec = parse_worker(fields, {n: None for n in self._models.names()},
                                f"discovery pod {endpoint.worker_id}", prefix)
        except ValueError as exc:
            return None, str(exc)
        if self._discovery.api_key_env is None and (
                problem := runtime_key_problem(spec, prefix, self._config.workers)):
            return None, problem
        return spec, ""
