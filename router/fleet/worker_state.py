"""A worker as the router sees it (``WorkerState``), its request totals, and the
in-flight count of one attempt on it (``InFlight``).

In-flight counts are the router's own, changed at decision time (``InFlight``'s
creation) and at the end of the request (``end``): a burst of decisions sees its own
effect at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from radix.namespace import CacheNamespace
from router.config import WorkerSpec
from router.fleet.cache_prediction import EXACT, OVER, UNDER
from router.fleet.expectations import Mismatch
from router.fleet.load_state import LoadState
from router.fleet.probes import WorkerLoad
from router.routing.adapters import WorkerLora
from router.routing.views import WorkerView
from router.worker_kinds import WORKER_KINDS, EventSource


@dataclass
class WorkerStats:
    """Totals over requests this router sent to a worker: prompt tokens, tokens the
    index predicted cached (matched) and tokens the worker reported cached; and, of the
    requests whose prediction was checked (``router.fleet.cache_prediction``), how many
    came out exact, over, under and in flight."""

    num_requests: int = 0
    num_prompt_tokens: int = 0
    num_matched_tokens: int = 0
    num_cached_tokens: int = 0
    num_exact_predictions: int = 0
    num_over_predictions: int = 0
    num_under_predictions: int = 0
    num_in_flight_predictions: int = 0

    def record(self, num_prompt_tokens: int, num_matched_tokens: int,
               num_cached_tokens: int | None) -> None:
        """Add one finished request."""
        self.num_requests += 1
        self.num_prompt_tokens += num_prompt_tokens
        self.num_matched_tokens += num_matched_tokens
        self.num_cached_tokens += num_cached_tokens or 0

    def record_prediction(self, outcome: str) -> None:
        """Count one checked prediction under its outcome (``EXACT``, ``OVER``,
        ``UNDER``, ``IN_FLIGHT``)."""
        if outcome == EXACT:
            self.num_exact_predictions += 1
        elif outcome == OVER:
            self.num_over_predictions += 1
        elif outcome == UNDER:
            self.num_under_predictions += 1
        else:
            self.num_in_flight_predictions += 1

    def to_dict(self) -> dict[str, object]:
        """Totals plus hit rates (cached / prompt, matched / prompt) and
        ``exact_fraction``: of the checked predictions not ``in_flight``, the share that
        were exact (None before the first)."""
        total = max(self.num_prompt_tokens, 1)
        num_checked = (self.num_exact_predictions + self.num_over_predictions
                       + self.num_under_predictions)
        return {**asdict(self), "hit_rate": self.num_cached_tokens / total,
                "predicted_hit_rate": self.num_matched_tokens / total,
                "exact_fraction": (self.num_exact_predictions / num_checked
                                   if num_checked else None)}


class WorkerState:
    """One worker as the router sees it. Mutated only by the registry; read by the
    dispatcher, the proxy and the admin routes. ``config`` is what it was registered
    with; ``namespace`` is the router-side digest of the worker's base cache namespace
    (None until the first passing probe), ``worker_namespace`` the worker's own digest
    of it, ``cache_namespace`` its fields (None for a kind whose namespace the router
    builds itself); ``lora`` its LoRA adapters (``router.routing.adapters``). ``discovered``: it
    came from ``router.fleet.discovery`` (each router discovers its own; never shared);
    ``draining``: it takes no new request and leaves once those in flight end;
    ``capabilities``: what its kind can do (``router.worker_kinds``);
    ``transfer_endpoint``: the (host, port) its KV producer reported under its key at
    the last probe (None: none), the only place a prefill leg's params may name;
    ``transfer_info`` the whole ``kv_transfer`` object of its ``/info`` (whether it
    pulls, its KV costs; ``router.sources`` reads it). ``num_in_flight_*``: this
    router's requests there (``InFlight``): requests not ended, and of those before
    their first token the uncached prompt tokens, the whole prompts' tokens, and the
    context those uncached tokens attend over (``WorkerView``).
    ``index_mode``: how its index entries are trusted, ``"exact"`` (from its KV
    events), ``"approximate"`` (from what was routed to it) or ``"stale"`` (it has an
    event stream, but not one followed and caught up now:
    ``router.fleet.events.health``), with ``index_reason`` and ``index_since`` (wall
    clock) of the last change; ``events_heard_at`` (monotonic) is when its stream last
    delivered an event or heartbeat (None: never followed). ``load_state``: its load and
    how the router knows it, polled, pushed or unknown (``router.fleet.load_state``);
    ``load`` is the last one reported. ``expectation_mismatches``: the model's
    expectations its last probe found unmet (``router.fleet.expectations``)."""

    __slots__ = ("config", "worker_id", "kind", "capabilities", "model", "url", "headers", "ready", "reason",
                 "namespace", "epoch", "served_model", "load_state", "num_in_flight_requests",
                 "num_in_flight_prompt_tokens", "num_in_flight_sent_tokens",
                 "num_in_flight_context_tokens", "stats",
                 "index_mode", "index_reason",
                 "index_since", "events_heard_at",
                 "cache_block_size", "worker_namespace", "lora", "discovered", "draining", "role",
                 "transfer_endpoint", "cache_namespace", "transfer_info",
                 "expectation_mismatches")

    def __init__(self, config: WorkerSpec, url: str, headers: dict[str, str],
                 discovered: bool = False) -> None:
        self.config = config
        self.worker_id = config.worker_id
        self.kind = config.kind
        self.capabilities = WORKER_KINDS[config.kind]
        self.model = config.model
        self.url = url.rstrip("/")
        self.headers = headers
        self.ready = False
        self.reason = "not probed yet"
        self.namespace: str | None = None
        self.epoch: str | None = None
        self.served_model: str | None = None
        self.load_state = LoadState()
        self.num_in_flight_requests = 0
        self.num_in_flight_prompt_tokens = 0
        self.num_in_flight_sent_tokens = 0
        self.num_in_flight_context_tokens = 0.0
        self.stats = WorkerStats()
        self.index_mode = "stale" if self.has_event_stream else "approximate"
        self.index_reason = ("events not followed yet" if self.has_event_stream
                             else "publishes no KV events")
        self.index_since = time.time()
        self.events_heard_at: float | None = None
        self.cache_block_size: int | None = None
        self.worker_namespace: str | None = None
        self.lora = WorkerLora()
        self.discovered = discovered
        self.draining = False
        self.role = config.role
        self.transfer_endpoint: tuple[str, int] | None = None
        self.cache_namespace: CacheNamespace | None = None
        self.transfer_info: Mapping[str, Any] | None = None
        self.expectation_mismatches: tuple[Mismatch, ...] = ()

    @property
    def load(self) -> WorkerLoad:
        """The load the worker last reported (a probe's or a load frame's)."""
        return self.load_state.load

    @load.setter
    def load(self, load: WorkerLoad) -> None:
        self.load_state.polled(load)

    @property
    def has_event_stream(self) -> bool:
        """Whether the worker publishes KV events the router can follow."""
        events = self.capabilities.events
        return events is EventSource.OWN_STREAM or (
            events is EventSource.ZMQ_WHEN_CONFIGURED and self.config.kv_events is not None)

    def set_index_mode(self, mode: str, reason: str) -> None:
        """Record how the worker's index entries are trusted now (``index_mode``), and
        why; ``index_since`` moves only when the mode changes."""
        if mode != self.index_mode:
            self.index_mode, self.index_since = mode, time.time()
        self.index_reason = reason

    def view(self, num_matched_tokens: int, num_matched_routed_tokens: int,
             adapter: str | None, default_adapter_load_ms: float,
             request_limit: int | None = None) -> WorkerView:
        """This worker as a policy sees it now, for a request matching
        ``num_matched_tokens`` here (``num_matched_routed_tokens`` of them only routed)
        for ``adapter`` (None: the base model), whose load time is
        ``default_adapter_load_ms`` until measured. ``request_limit`` (flow control's
        headroom bound) lowers the requests it is seen to admit."""
        load = self.load_state.load
        running, waiting, waiting_tokens, kv_usage = self.load_state.measures(
            self.num_in_flight_requests)
        waiting_tokens -= self.num_in_flight_sent_tokens
        max_num_requests = load.max_num_requests
        if request_limit is not None:
            max_num_requests = (request_limit if max_num_requests is None
                                else min(max_num_requests, request_limit))
        if adapter is None:
            load_ms = swap_share = 0.0
        else:
            load_ms = self.lora.load_ms(adapter, default_adapter_load_ms)
            swap_share = self.lora.swap_share(
                adapter, max(running, self.num_in_flight_requests))
        return WorkerView(
            worker_id=self.worker_id,
            num_in_flight_requests=self.num_in_flight_requests,
            num_in_flight_prompt_tokens=self.num_in_flight_prompt_tokens,
            num_in_flight_context_tokens=self.num_in_flight_context_tokens,
            num_requests_running=running,
            num_requests_waiting=waiting,
            num_waiting_tokens=waiting_tokens if waiting_tokens > 0 else 0,
            kv_cache_usage_ratio=kv_usage,
            max_num_requests=max_num_requests,
            num_matched_tokens=num_matched_tokens,
            num_matched_routed_tokens=num_matched_routed_tokens,
            adapter_load_ms=load_ms,
            adapter_swap_share=swap_share,
            num_held_blocks=load.num_held_blocks,
            max_held_blocks=load.max_held_blocks,
        )

    def to_dict(self) -> dict[str, object]:
        """JSON view for ``GET /admin/workers``."""
        return {
            "id": self.worker_id, "kind": self.kind, "role": self.role, "model": self.model,
            "url": self.url,
            "ready": self.ready, "reason": self.reason, "namespace": self.namespace,
            "discovered": self.discovered, "draining": self.draining,
            "epoch": self.epoch, "served_model": self.served_model,
            "index_mode": self.index_mode, "index_reason": self.index_reason,
            "index_since": self.index_since,
            "cache_block_size": self.cache_block_size,
            "load": asdict(self.load_state.load),
            "load_source": self.load_state.source,
            "load_seq": self.load_state.seq,
            "load_age_s": self.load_state.age_s(),
            "num_in_flight_requests": self.num_in_flight_requests,
            "num_in_flight_prompt_tokens": self.num_in_flight_prompt_tokens,
            "stats": self.stats.to_dict(),
            "adapters": sorted(self.lora.adapters),
            "resident_adapters": self.lora.residency.resident(),
            "lora_load_ms": self.lora.measured_load_ms,
            "expectation_mismatches": [m.to_dict() for m in self.expectation_mismatches],
        }


class InFlight:
    """One attempt counted in its worker's in-flight load: the request until ``end``
    (when it ends or moves to another worker), its prompt tokens until ``prefilled``
    (its first token came: the worker's prefill is done) or ``end``: the
    ``num_prompt_tokens`` to prefill (uncached at decision: the prompt's last ones) in
    ``num_in_flight_prompt_tokens`` and their context in
    ``num_in_flight_context_tokens``. A ``sent`` request (``WorkerRegistry.begin``)
    also counts the ``num_sent_tokens`` of its whole prompt in
    ``num_in_flight_sent_tokens`` and in the worker's pushed load until its next frame
    (``LoadState.sent``); a placeholder (a flow turn, a request whose peer's hold is
    awaited) is not on its way yet, so it is in neither. ``on_prefilled`` (None:
    nothing) is called once, at the first of the two."""

    __slots__ = ("_worker", "_num_prompt_tokens", "_num_sent_tokens", "_num_context_tokens",
                 "on_prefilled")

    def __init__(self, worker: WorkerState, num_prompt_tokens: int,
                 num_sent_tokens: int, sent: bool = False) -> None:
        self._worker = worker
        self._num_prompt_tokens = num_prompt_tokens
        self._num_sent_tokens = num_sent_tokens if sent else 0
        self._num_context_tokens = num_prompt_tokens * (num_sent_tokens - 0.5 * num_prompt_tokens)
        self.on_prefilled: Callable[[], None] | None = None
        worker.num_in_flight_requests += 1
        worker.num_in_flight_prompt_tokens += num_prompt_tokens
        worker.num_in_flight_sent_tokens += self._num_sent_tokens
        worker.num_in_flight_context_tokens += self._num_context_tokens
        if sent:
            worker.load_state.sent(num_sent_tokens)

    def prefilled(self) -> None:
        """The prompt tokens are no longer queued work (idempotent)."""
        self._worker.num_in_flight_prompt_tokens -= self._num_prompt_tokens
        self._worker.num_in_flight_sent_tokens -= self._num_sent_tokens
        self._worker.num_in_flight_context_tokens -= self._num_context_tokens
        self._num_prompt_tokens = self._num_sent_tokens = 0
        self._num_context_tokens = 0.0
        if self.on_prefilled is not None:
            on_prefilled, self.on_prefilled = self.on_prefilled, None
            on_prefilled()

    def end(self) -> None:
        """The attempt is over."""
        self.prefilled()
        self._worker.num_in_flight_requests -= 1
