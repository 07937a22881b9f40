"""The worker registry: which workers exist, which may be routed to, and their load.

Workers come from the config, ``POST /admin/workers``, the shared registry and
discovery (``router.fleet.discovery``), all through ``add``. One poll task per worker
probes it (``router.fleet.probes``): every ``poll_interval_s``, or, while it pushes its
load on its KV event stream, every ``probe_interval_s`` and whenever its
``LoadState.probe_wanted`` is set (``router.fleet.load_state``). A worker enters routing when
a probe passes (the model's expectations met: ``router.fleet.expectations``), and
leaves it (and the index: ``RouterIndex.reset_worker``) when a
probe fails or the proxy cannot reach it; it comes back at the next passing probe.
While a ``radix`` worker is routable, its KV event follower task runs; it is stopped
before the worker's index entries are dropped, so no stale event lands afterwards.

A draining worker (``drain``: its pod is being deleted or went unready) takes no new
request; it is removed once its requests in flight end, or at the drain's deadline.

The workers themselves are ``router.fleet.worker_state``'s ``WorkerState``s; their
in-flight counts change at decision time (``begin``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import aiohttp

from router.config import RegistryConfig, WorkerSpec
from router.fleet.model_namespaces import ModelNamespaces
from router.fleet.probes import ProbeResult, probe_openai, probe_radix
from router.fleet.salt_probe import PROBE_TOKENS, SaltProbeFailed, salt_isolation_problem
from router.fleet.worker_state import InFlight, WorkerState
from router.models import Models
from router.tasks import cancel_and_wait

log = logging.getLogger(__name__)
SALT_PROBE_TIMEOUT_S = 30.0
SALT_RECHECK_S = 60.0
DRAIN_POLL_S = 0.05


class WorkerIndex(Protocol):
    """What the registry needs of the router index."""

    def reset_worker(self, worker_id: str) -> None:
        """Drop everything the index holds for ``worker_id``."""

    def set_approximate(self, worker_id: str) -> None:
        """``worker_id`` publishes no KV events: keep what is routed to it longer."""


EventFollower = Callable[[WorkerState], Coroutine[Any, Any, None]]


class WorkerRegistry:
    """Owns the WorkerStates, their poll tasks and their KV event follower tasks;
    ``namespaces`` groups each model's routable workers by cache namespace."""

    def __init__(self, config: RegistryConfig, models: Models, secret: bytes,
                 session: aiohttp.ClientSession, index: WorkerIndex,
                 follow_events: EventFollower) -> None:
        self._config = config
        self._models = models
        self._secret = secret
        self._session = session
        self._index = index
        self._follow_events = follow_events
        self._workers: dict[str, WorkerState] = {}
        self._routable: dict[str, list[WorkerState]] = {}
        self._poll_tasks: dict[str, asyncio.Task[None]] = {}
        self._follow_tasks: dict[str, asyncio.Task[None]] = {}
        self._salt_refusals: dict[str, tuple[float, str]] = {}
        self._adapters: dict[str, str] = {}
        self.namespaces = ModelNamespaces(models.names())

    def add(self, config: WorkerSpec, discovered: bool = False) -> WorkerState:
        """Register a worker and start polling it; ValueError naming the field if the id
        is taken, the model unknown, the URL missing or its API key variable unset.
        ``discovered`` marks a worker discovery found (``WorkerState.discovered``)."""
        if config.worker_id in self._workers:
            raise ValueError(f"id: worker {config.worker_id!r} already exists")
        self._models.get(config.model)
        if config.url is None:
            raise ValueError(f"url: worker {config.worker_id!r} has no URL")
        headers = {}
        if config.api_key_env is not None:
            key = os.environ.get(config.api_key_env)
            if not key:
                raise ValueError(f"api_key_env: ${config.api_key_env} is not set")
            headers["Authorization"] = f"Bearer {key}"
        worker = WorkerState(config, config.url, headers, discovered)
        if not worker.has_event_stream:
            self._index.set_approximate(worker.worker_id)
        self._workers[worker.worker_id] = worker
        self._poll_tasks[worker.worker_id] = asyncio.create_task(self._poll(worker))
        return worker

    async def remove(self, worker_id: str) -> bool:
        """Stop routing to, polling and following a worker, and drop its index entries.
        Returns False if there was no such worker."""
        worker = self._workers.pop(worker_id, None)
        if worker is None:
            return False
        await cancel_and_wait(self._poll_tasks.pop(worker_id))
        await self._leave(worker, "removed")
        self._rebuild_adapters()
        return True

    async def drain(self, worker_id: str, timeout_s: float) -> None:
        """Stop routing to ``worker_id`` now, and remove it once it has no request in
        flight or ``timeout_s`` passed, whichever is first (unless ``resume`` or
        ``remove`` came first)."""
        worker = self._workers.get(worker_id)
        if worker is None:
            return
        worker.draining = True
        self._rebuild_routable()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (worker.num_in_flight_requests > 0 and loop.time() < deadline
               and worker.draining and self._workers.get(worker_id) is worker):
            await asyncio.sleep(DRAIN_POLL_S)
        if worker.draining and self._workers.get(worker_id) is worker:
            await self.remove(worker_id)

    def resume(self, worker_id: str) -> None:
        """Route to a draining worker again (its pod is ready again)."""
        worker = self._workers.get(worker_id)
        if worker is not None and worker.draining:
            worker.draining = False
            self._rebuild_routable()

    async def close(self) -> None:
        """Remove every worker."""
        for worker_id in list(self._workers):
            await self.remove(worker_id)

    def get(self, worker_id: str) -> WorkerState | None:
        """The worker called ``worker_id``, if registered."""
        return self._workers.get(worker_id)

    def workers(self) -> list[WorkerState]:
        """Every registered worker, in registration order."""
        return list(self._workers.values())

    def routable(self, model: str) -> list[WorkerState]:
        """Workers serving ``model`` whose last probe passed and that are not draining
        (do not mutate the list)."""
        return self._routable.get(model, [])

    def adapters(self) -> dict[str, str]:
        """Every LoRA adapter a registered worker reported at its last passing probe, by
        name, with the model it adapts (the first such worker's, in registration
        order). Do not mutate the dict."""
        return self._adapters

    def _rebuild_adapters(self) -> None:
        found: dict[str, str] = {}
        for worker in self._workers.values():
            for name in worker.lora.adapters:
                found.setdefault(name, worker.model)
        self._adapters = found

    @staticmethod
    def begin(worker: WorkerState, num_prompt_tokens: int, num_sent_tokens: int) -> InFlight:
        """Count a request sent to ``worker`` with ``num_prompt_tokens`` to prefill of
        its ``num_sent_tokens`` (call once per attempt, as it is sent): a ``sent``
        ``InFlight``. A placeholder counted while a request is still being decided is
        an ``InFlight`` that is not ``sent``."""
        return InFlight(worker, num_prompt_tokens, num_sent_tokens, sent=True)

    async def mark_failed(self, worker: WorkerState, reason: str) -> None:
        """The proxy could not reach ``worker``: take it out of routing and the index
        until a probe passes again."""
        if worker.ready:
            log.warning("worker %s failed: %s", worker.worker_id, reason)
            await self._leave(worker, reason)

    async def _poll(self, worker: WorkerState) -> None:
        model = self._models.get(worker.model)
        while True:
            try:
                sent_at = time.monotonic()
                if worker.capabilities.speaks_generate:
                    result = await probe_radix(self._session, worker.url, worker.headers,
                                               self._config.probe_timeout_s, model, self._secret)
                else:
                    result = await probe_openai(self._session, worker.url, worker.headers,
                                                self._config.probe_timeout_s, model,
                                                self._secret, worker.kind)
                await self._apply(worker, result, sent_at)
            except Exception:  # a bug here must not stop polling this worker
                log.exception("polling worker %s failed", worker.worker_id)
            await self._until_next_probe(worker)

    async def _until_next_probe(self, worker: WorkerState) -> None:
        """Wait ``probe_interval_s`` for a ready worker that pushes its load (or until it
        wants a probe sooner), else ``poll_interval_s``."""
        state = worker.load_state
        if not (worker.ready and state.pushes):
            await asyncio.sleep(self._config.poll_interval_s)
        else:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._config.probe_interval_s):
                    await state.probe_wanted.wait()
        state.probe_wanted.clear()

    async def _apply(self, worker: WorkerState, result: ProbeResult, sent_at: float) -> None:
        if result.mismatches != worker.expectation_mismatches:
            if result.mismatches:
                log.warning("worker %s not routed: %s", worker.worker_id, result.reason)
            worker.expectation_mismatches = result.mismatches
        if not result.ready:
            if worker.ready:
                log.warning("worker %s not ready: %s", worker.worker_id, result.reason)
                await self._leave(worker, result.reason)
            worker.reason = result.reason
            return
        if worker.ready and worker.namespace != result.namespace:
            await self._leave(worker, "namespace changed")
        worker.load = result.load
        worker.epoch = result.epoch
        worker.served_model = result.served_model
        worker.cache_block_size = result.cache_block_size
        worker.worker_namespace = result.worker_namespace
        worker.transfer_endpoint = result.transfer_endpoint
        worker.transfer_info = result.transfer_info
        worker.lora.observe(result.adapters, result.max_loras, result.lora_load_ms, sent_at)
        self._rebuild_adapters()
        if not worker.ready:
            if (not worker.capabilities.speaks_generate
                    and (problem := await self._salt_problem(worker))):
                worker.reason = problem
                return
            worker.namespace, worker.cache_namespace = result.namespace, result.cache_namespace
            worker.ready = True
            worker.reason = result.reason
            if worker.has_event_stream:
                self._follow_tasks[worker.worker_id] = asyncio.create_task(
                    self._follow_events(worker))
            self._rebuild_routable()
            log.info("worker %s ready at %s", worker.worker_id, worker.url)

    async def _salt_problem(self, worker: WorkerState) -> str | None:
        """Why an OpenAI-compatible worker may not be routed to tenants
        (``router.fleet.salt_probe``), checked as it becomes ready; a refusal is
        remembered for ``SALT_RECHECK_S`` so a refused backend is not probed every poll,
        a failed probe is tried again at the next poll."""
        now = asyncio.get_running_loop().time()
        refused = self._salt_refusals.get(worker.worker_id)
        if refused is not None and now - refused[0] < SALT_RECHECK_S:
            return refused[1]
        model = self._models.get(worker.model)
        words = " ".join(f"salt probe {i}" for i in range(PROBE_TOKENS))
        token_ids = model.tokenizer.encode(words, add_special_tokens=False)[:PROBE_TOKENS]
        try:
            problem = await salt_isolation_problem(
                self._session, worker.url, worker.headers, worker.served_model or worker.model,
                token_ids, SALT_PROBE_TIMEOUT_S, worker.config.trust_cache_salt)
        except SaltProbeFailed as exc:
            log.info("worker %s not routed yet: %s", worker.worker_id, exc)
            return str(exc)
        if problem is None:
            self._salt_refusals.pop(worker.worker_id, None)
        else:
            log.warning("worker %s not routed: %s", worker.worker_id, problem)
            self._salt_refusals[worker.worker_id] = (now, problem)
        return problem

    async def _leave(self, worker: WorkerState, reason: str) -> None:
        worker.ready = False
        worker.reason = reason
        self._rebuild_routable()
        task = self._follow_tasks.pop(worker.worker_id, None)
        if task is not None:
            await cancel_and_wait(task)
        self._index.reset_worker(worker.worker_id)

    def _rebuild_routable(self) -> None:
        routable: dict[str, list[WorkerState]] = {}
        for worker in self._workers.values():
            if worker.ready and not worker.draining:
                routable.setdefault(worker.model, []).append(worker)
        self._routable = routable
        self.namespaces.observe(routable)


