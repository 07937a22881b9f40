"""LoRA adapters as the router sees them: which a worker registered, which it holds in
its slots now, and what a request for one costs there.

A worker registers adapters (``/ready``'s ``adapters``) and holds at most
``max_loras`` of them in its slots, evicting the least recently used one to load
another. Its probe says which are resident, but a probe is up to a poll interval
old: between probes the router predicts residency from its own decisions
(``Residency``): an adapter it routes to a worker becomes resident there, most
recently used, at the moment of decision (as the in-flight counts do), pushing out
that worker's least recently used adapter once its slots are full. A probe resets
the prediction to what the worker reported, keeping adapters routed since the probe
was sent (the worker may not have loaded them when it answered).

A request for an adapter that is not (predicted) resident on a worker pays its load
there: ``WorkerLora.load_ms`` (the worker's measured mean, or the policy's default
until it has measured one), which the policy turns into prefill-token equivalents, and a swap
where the load evicts another adapter, in proportion to how busy the worker is
(``swap_share``): its running requests pin their adapters' slots, so on a busy worker
the load may wait for a slot to free, and the evicted adapter is likely wanted again.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from router.routing.index import NamespaceDigest


@dataclass(frozen=True)
class WorkerAdapter:
    """An adapter a worker registered: its name, the router's digest of its cache
    namespace (its entries in the index), the digest the worker's own KV events carry
    (``worker_namespace``), and whether the worker reported it resident."""

    name: str
    namespace: NamespaceDigest
    worker_namespace: str
    resident: bool


class Residency:
    """The adapters one worker holds in its slots, as this router predicts them.

    ``is_resident`` is true for an adapter the last probe reported resident or that
    this router routed there since (and that has not been pushed out since by
    ``max_loras`` more recently routed ones). Only the registry and the dispatcher
    change it: ``observe`` at each probe, ``route`` at each decision."""

    __slots__ = ("max_loras", "_routed_at", "_resident")

    def __init__(self) -> None:
        self.max_loras = 0
        self._routed_at: dict[str, float] = {}
        self._resident: list[str] = []

    def is_resident(self, name: str) -> bool:
        """Whether ``name`` is predicted to be in one of the worker's slots."""
        return name in self._resident

    def resident(self) -> list[str]:
        """The predicted resident adapters, least recently used first."""
        return list(self._resident)

    @property
    def num_resident(self) -> int:
        """How many adapters are predicted resident."""
        return len(self._resident)

    def observe(self, resident: Iterable[str], max_loras: int, probe_sent_at: float) -> None:
        """A probe sent at ``probe_sent_at`` (the ``route`` clock) reported ``resident``
        and ``max_loras`` slots: predict those, plus the adapters routed here since the
        probe was sent, keeping the ``max_loras`` most recently used."""
        self.max_loras = max_loras
        reported = set(resident)
        recent = {name for name, at in self._routed_at.items() if at >= probe_sent_at}
        self._resident = self._most_recent(reported | recent)

    def route(self, name: str, now: float) -> None:
        """``name`` was just routed to this worker at ``now``: it is resident, most
        recently used; the least recently used beyond ``max_loras`` are not."""
        self._routed_at[name] = now
        self._resident = self._most_recent({*self._resident, name})

    def _most_recent(self, names: set[str]) -> list[str]:
        never = float("-inf")
        ordered = sorted(names, key=lambda n: (self._routed_at.get(n, never), n))
        keep = ordered[-self.max_loras:] if self.max_loras else []
        self._routed_at = {n: self._routed_at[n] for n in keep if n in self._routed_at}
        return keep


class WorkerLora:
    """A worker's LoRA side, as its probes report it and this router's decisions
    predict it: the adapters it registered by name, their residency, its measured
    load time, and which of the router's namespaces each of its KV events belongs to.
    Changed only by the registry (``observe``) and the dispatcher (``residency.route``)."""

    __slots__ = ("adapters", "residency", "measured_load_ms", "_event_namespaces")

    def __init__(self) -> None:
        self.adapters: dict[str, WorkerAdapter] = {}
        self.residency = Residency()
        self.measured_load_ms: float | None = None
        self._event_namespaces: dict[str, NamespaceDigest] = {}

    def observe(self, adapters: Iterable[WorkerAdapter], max_loras: int,
                measured_load_ms: float | None, probe_sent_at: float) -> None:
        """A passing probe sent at ``probe_sent_at`` reported these adapters, slots
        and load time."""
        self.adapters = {a.name: a for a in adapters}
        self.measured_load_ms = measured_load_ms
        self._event_namespaces = {a.worker_namespace: a.namespace for a in self.adapters.values()}
        self.residency.observe([a.name for a in self.adapters.values() if a.resident], max_loras,
                               probe_sent_at)

    def namespace(self, adapter: str | None, base: str | None) -> str | None:
        """The router's namespace of ``adapter`` on this worker (``base`` for the base
        model); None when the worker did not register it."""
        if adapter is None:
            return base
        found = self.adapters.get(adapter)
        return None if found is None else found.namespace

    def event_namespace(self, worker_namespace: str, base: NamespaceDigest,
                        worker_base: str | None) -> str:
        """The router's namespace for an event the worker filed under
        ``worker_namespace``: a registered adapter's, else ``base`` when it is the
        worker's base namespace or the worker registered no adapter; an unknown
        adapter's events (one loaded since the last probe) keep the worker's digest,
        which no request of this router looks up."""
        found = self._event_namespaces.get(worker_namespace)
        if found is not None:
            return found
        if worker_namespace == worker_base or not self.adapters:
            return base
        return worker_namespace

    def load_ms(self, adapter: str | None, default_ms: float) -> float:
        """Milliseconds a request for ``adapter`` waits for its load here: 0 for the
        base model (``None``) and for a resident adapter, else the measured mean load
        time, or ``default_ms`` until one is measured."""
        if adapter is None or self.residency.is_resident(adapter):
            return 0.0
        return default_ms if self.measured_load_ms is None else self.measured_load_ms

    def swap_share(self, adapter: str | None, num_active_requests: int) -> float:
        """The share of a swap that loading ``adapter`` here costs: 0 when it is
        (predicted) resident or a slot is free, else the worker's active requests over
        its slots, at most 1."""
        residency = self.residency
        if (adapter is None or residency.is_resident(adapter)
                or residency.num_resident < residency.max_loras):
            return 0.0
        return min(1.0, num_active_requests / residency.max_loras)
