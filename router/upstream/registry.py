"""The worker registry: which workers exist, which may be routed to, and their load.

Workers come from the config and ``POST /admin/workers``. One poll task per worker
probes it every ``poll_interval_s`` (``router.upstream.attempt.probes``). A worker enters routing when
a probe passes, and leaves it (and the index: ``RouterIndex.reset_worker``) when a
probe fails or the proxy cannot reach it; it comes back at the next passing probe.
While a ``radix`` worker is routable, its KV event follower task runs; it is stopped
before the worker's index entries are dropped, so no stale event lands afterwards.

In-flight counts are the router's own, changed at decision time (``begin``) and at
the end of the request (``end``): a burst of decisions sees its own effect at once.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import aiohttp

from router.config import RegistryConfig, WorkerConfig
from router.front.tokenization import Models
from router.tasks import cancel_and_wait
from router.upstream.probes import ProbeResult, WorkerLoad, probe_openai, probe_radix
from router.upstream.salt_probe import PROBE_TOKENS, salt_isolation_problem

log = logging.getLogger(__name__)
SALT_PROBE_TIMEOUT_S = 30.0
SALT_RECHECK_S = 60.0


@dataclass
class WorkerStats:
    """Totals over requests this router sent to a worker: prompt tokens, tokens the
    index predicted cached (matched) and tokens the worker reported cached."""

    num_requests: int = 0
    num_prompt_tokens: int = 0
    num_matched_tokens: int = 0
    num_cached_tokens: int = 0

    def record(self, num_prompt_tokens: int, num_matched_tokens: int,
               num_cached_tokens: int | None) -> None:
        """Add one finished request."""
        self.num_requests += 1
        self.num_prompt_tokens += num_prompt_tokens
        self.num_matched_tokens += num_matched_tokens
        self.num_cached_tokens += num_cached_tokens or 0

    def to_dict(self) -> dict[str, object]:
        """Totals plus hit rates (cached / prompt, matched / prompt)."""
        total = max(self.num_prompt_tokens, 1)
        return {**asdict(self), "hit_rate": self.num_cached_tokens / total,
                "predicted_hit_rate": self.num_matched_tokens / total}


class WorkerState:
    """One worker as the router sees it. Mutated only by the registry; read by the
    dispatcher, the proxy and the admin routes. ``config`` is what it was registered
    with; ``namespace`` is the router-side digest of the worker's cache namespace
    (None until the first passing probe)."""

    __slots__ = ("config", "worker_id", "kind", "model", "url", "headers", "ready", "reason",
                 "namespace", "epoch", "served_model", "load", "num_in_flight_requests",
                 "num_in_flight_prompt_tokens", "stats", "index_mode", "index_reason",
                 "cache_block_size")

    def __init__(self, config: WorkerConfig, url: str, headers: dict[str, str]) -> None:
        self.config = config
        self.worker_id = config.worker_id
        self.kind = config.kind
        self.model = config.model
        self.url = url.rstrip("/")
        self.headers = headers
        self.ready = False
        self.reason = "not probed yet"
        self.namespace: str | None = None
        self.epoch: str | None = None
        self.served_model: str | None = None
        self.load = WorkerLoad()
        self.num_in_flight_requests = 0
        self.num_in_flight_prompt_tokens = 0
        self.stats = WorkerStats()
        self.index_mode = "exact" if self.has_event_stream else "approximate"
        self.index_reason = "" if self.has_event_stream else "publishes no KV events"
        self.cache_block_size: int | None = None

    @property
    def has_event_stream(self) -> bool:
        """Whether the worker publishes KV events the router can follow."""
        return self.kind == "radix" or (self.kind == "vllm" and self.config.kv_events is not None)

    def to_dict(self) -> dict[str, object]:
        """JSON view for ``GET /admin/workers``."""
        return {
            "id": self.worker_id, "kind": self.kind, "model": self.model, "url": self.url,
            "ready": self.ready, "reason": self.reason, "namespace": self.namespace,
            "epoch": self.epoch, "served_model": self.served_model,
            "index_mode": self.index_mode, "index_reason": self.index_reason,
            "cache_block_size": self.cache_block_size,
            "load": asdict(self.load),
            "num_in_flight_requests": self.num_in_flight_requests,
            "num_in_flight_prompt_tokens": self.num_in_flight_prompt_tokens,
            "stats": self.stats.to_dict(),
        }


class InFlight:
    """One attempt counted in its worker's in-flight load: the request until ``end``
    (when it ends or moves to another worker), its prompt tokens until ``prefilled``
    (its first token came: the worker's prefill is done) or ``end``."""

    __slots__ = ("_worker", "_num_prompt_tokens")

    def __init__(self, worker: WorkerState, num_prompt_tokens: int) -> None:
        self._worker = worker
        self._num_prompt_tokens = num_prompt_tokens
        worker.num_in_flight_requests += 1
        worker.num_in_flight_prompt_tokens += num_prompt_tokens

    def prefilled(self) -> None:
        """The prompt tokens are no longer queued work (idempotent)."""
        self._worker.num_in_flight_prompt_tokens -= self._num_prompt_tokens
        self._num_prompt_tokens = 0

    def end(self) -> None:
        """The attempt is over."""
        self.prefilled()
        self._worker.num_in_flight_requests -= 1


class WorkerIndex(Protocol):
    """What the registry needs of the router index."""

    def reset_worker(self, worker_id: str) -> None:
        """Drop everything the index holds for ``worker_id``."""

    def set_approximate(self, worker_id: str) -> None:
        """``worker_id`` publishes no KV events: keep what is routed to it longer."""


EventFollower = Callable[[WorkerState], Coroutine[Any, Any, None]]


class WorkerRegistry:
    """Owns the WorkerStates, their poll tasks and their KV event follower tasks."""

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

    def add(self, config: WorkerConfig) -> WorkerState:
        """Register a worker and start polling it; ValueError naming the field if the id
        is taken, the model unknown, the URL missing or its API key variable unset."""
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
        worker = WorkerState(config, config.url, headers)
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
        return True

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
        """Workers serving ``model`` whose last probe passed (do not mutate the list)."""
        return self._routable.get(model, [])

    @staticmethod
    def begin(worker: WorkerState, num_prompt_tokens: int) -> InFlight:
        """Count a request routed to ``worker`` with ``num_prompt_tokens`` to prefill
        (call at decision time)."""
        return InFlight(worker, num_prompt_tokens)

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
                if worker.kind == "radix":
                    result = await probe_radix(self._session, worker.url, worker.headers,
                                               self._config.probe_timeout_s, model, self._secret)
                else:
                    result = await probe_openai(self._session, worker.url, worker.headers,
                                                self._config.probe_timeout_s, model,
                                                self._secret, worker.kind)
                await self._apply(worker, result)
            except Exception:  # a bug here must not stop polling this worker
                log.exception("polling worker %s failed", worker.worker_id)
            await asyncio.sleep(self._config.poll_interval_s)

    async def _apply(self, worker: WorkerState, result: ProbeResult) -> None:
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
        if not worker.ready:
            if worker.kind != "radix" and (problem := await self._salt_problem(worker)):
                worker.reason = problem
                return
            worker.namespace = result.namespace
            worker.ready = True
            worker.reason = result.reason
            if worker.has_event_stream:
                self._follow_tasks[worker.worker_id] = asyncio.create_task(
                    self._follow_events(worker))
            self._rebuild_routable()
            log.info("worker %s ready at %s", worker.worker_id, worker.url)

    async def _salt_problem(self, worker: WorkerState) -> str | None:
        """Why an OpenAI-compatible worker may not be routed to tenants
        (``router.upstream.salt_probe``), checked as it becomes ready; a refusal is
        remembered for ``SALT_RECHECK_S`` so a refused backend is not probed every poll."""
        now = asyncio.get_running_loop().time()
        refused = self._salt_refusals.get(worker.worker_id)
        if refused is not None and now - refused[0] < SALT_RECHECK_S:
            return refused[1]
        model = self._models.get(worker.model)
        words = " ".join(f"salt probe {i}" for i in range(PROBE_TOKENS))
        token_ids = model.tokenizer.encode(words, add_special_tokens=False)[:PROBE_TOKENS]
        problem = await salt_isolation_problem(self._session, worker.url, worker.headers,
                                               worker.served_model or worker.model, token_ids,
                                               SALT_PROBE_TIMEOUT_S)
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
            if worker.ready:
                routable.setdefault(worker.model, []).append(worker)
        self._routable = routable


