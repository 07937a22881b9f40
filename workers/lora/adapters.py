"""Registered adapters and the slots they are resident in (engine thread only).

A worker registers adapters (``--lora-modules`` at start, ``/v1/load_lora_adapter``
at run time) and keeps at most ``max_loras`` of them resident, each in one slot of
preallocated weights. Residency is LRU among the adapters no admitted request uses:

- a request counts for its adapter from ``begin`` to ``end``; once its first sequence
  is admitted (``acquire``) it pins the adapter's slot until ``end``, so an adapter
  with a running request is never evicted;
- ``acquire`` for a non-resident adapter takes a free slot, else evicts the least
  recently used unpinned adapter (those with no request at all first); with every
  slot pinned it returns None and the request waits, at the head of the queue, for
  a running request to end (it is never failed for that);
- ``unregister`` hides the adapter from new requests at once; its slot and entry
  go when its last request ends;
- a load that fails (its files changed since they were checked) leaves the slot
  empty and the adapter unregistered, and raises to the caller, which fails the
  request that needed it alone.

Each adapter has its own cache namespace (its digest under the deployment secret),
so evicting it from its slot leaves its cached KV valid. ``published`` is an
immutable description swapped in after every change, for the HTTP thread.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from workers.lora.peft_files import AdapterError, AdapterSpec


class SlotLoader(Protocol):
    """Writes an adapter's weights into a slot (a real model's tensors, or a timed
    worker's wait)."""

    def load(self, slot: int, spec: AdapterSpec) -> None:
        """Make ``slot`` hold ``spec``'s weights (zero-padded to the slot's rank)."""

    def clear(self, slot: int) -> None:
        """Make ``slot`` add nothing."""


@dataclass(frozen=True)
class AdapterInfo:
    """One registered adapter as ``/ready`` reports it."""

    name: str
    digest: str
    namespace: str
    resident: bool
    path: str


@dataclass
class _Adapter:
    spec: AdapterSpec
    namespace: bytes
    slot: int | None = None
    num_requests: int = 0
    num_admitted: int = 0
    removed: bool = False


class AdapterSlots:
    """Registry plus slot residency (module docstring). ``namespace_of(spec)`` gives
    an adapter's namespace digest; ``on_load(seconds)`` observes each load."""

    def __init__(self, max_loras: int, loader: SlotLoader | None,
                 namespace_of: Callable[[AdapterSpec], bytes],
                 on_load: Callable[[float], None] = lambda seconds: None,
                 max_registered: int = 256) -> None:
        self.max_loras = max_loras
        self.max_registered = max_registered
        self._loader = loader
        self._namespace_of = namespace_of
        self._on_load = on_load
        self._adapters: dict[str, _Adapter] = {}
        self._slots: list[str | None] = [None] * max_loras
        self._lru: OrderedDict[str, None] = OrderedDict()  # resident, least recent first
        self.num_loads = 0
        self.load_seconds_total = 0.0
        self.published: tuple[AdapterInfo, ...] = ()

    @classmethod
    def disabled(cls) -> AdapterSlots:
        """No slots and no adapters (LoRA off): every adapter name is unknown."""
        return cls(0, None, lambda spec: b"")

    # ---- registry ------------------------------------------------------------------

    def register(self, spec: AdapterSpec) -> None:
        """Add a checked adapter; AdapterError when LoRA is off, the name is taken or
        ``max_registered`` adapters are registered already."""
        if self.max_loras == 0:
            raise AdapterError("LoRA is not enabled on this worker", "lora_name")
        if spec.name in self._adapters:
            raise AdapterError(f"the adapter {spec.name!r} is already loaded", "lora_name")
        if len(self._adapters) >= self.max_registered:
            raise AdapterError(f"this worker holds {len(self._adapters)} adapters, its most "
                               "(lora.max_registered): unload one first", "lora_name")
        self._adapters[spec.name] = _Adapter(spec, self._namespace_of(spec))
        self._publish()

    def unregister(self, name: str) -> None:
        """Hide ``name`` from new requests; KeyError when it is not registered."""
        adapter = self._live(name)
        adapter.removed = True
        self._drop_if_idle(name, adapter)
        self._publish()

    def namespace(self, name: str) -> bytes:
        """The namespace digest of a registered adapter (KeyError otherwise)."""
        return self._live(name).namespace

    def _live(self, name: str) -> _Adapter:
        adapter = self._adapters.get(name)
        if adapter is None or adapter.removed:
            raise KeyError(name)
        return adapter

    # ---- requests ------------------------------------------------------------------

    def begin(self, name: str) -> bytes:
        """Count a new request for ``name``; returns its namespace digest. KeyError
        when the adapter is not registered."""
        adapter = self._live(name)
        adapter.num_requests += 1
        return adapter.namespace

    def acquire(self, name: str) -> int | None:
        """Pin ``name``'s slot for one admitted request, loading it first if needed;
        None when every slot is pinned by other adapters."""
        adapter = self._adapters[name]
        if adapter.slot is None:
            slot = self._free_slot()
            if slot is None:
                return None
            self._load(name, adapter, slot)
        self._lru.move_to_end(name)
        adapter.num_admitted += 1
        return adapter.slot

    def end(self, name: str, admitted: bool) -> None:
        """A request of ``name`` ended (``admitted``: it had pinned the slot)."""
        adapter = self._adapters[name]
        adapter.num_requests -= 1
        if admitted:
            adapter.num_admitted -= 1
        self._drop_if_idle(name, adapter)

    # ---- slots ---------------------------------------------------------------------

    def _free_slot(self) -> int | None:
        """An empty slot, else the slot of the best victim (evicted), else None."""
        if None in self._slots:
            return self._slots.index(None)
        unpinned = [n for n in self._lru if not self._adapters[n].num_admitted]
        if not unpinned:
            return None
        victim = next((n for n in unpinned if not self._adapters[n].num_requests), unpinned[0])
        return self._evict(victim)

    def _evict(self, name: str) -> int:
        adapter = self._adapters[name]
        slot = adapter.slot
        assert slot is not None and not adapter.num_admitted
        adapter.slot = None
        self._slots[slot] = None
        del self._lru[name]
        return slot

    def _load(self, name: str, adapter: _Adapter, slot: int) -> None:
        assert self._loader is not None
        start = time.perf_counter()
        try:
            self._loader.load(slot, adapter.spec)
        except Exception:
            self._loader.clear(slot)
            adapter.removed = True
            self._publish()
            raise
        seconds = time.perf_counter() - start
        adapter.slot = slot
        self._slots[slot] = name
        self._lru[name] = None
        self.num_loads += 1
        self.load_seconds_total += seconds
        self._on_load(seconds)
        self._publish()

    def _drop_if_idle(self, name: str, adapter: _Adapter) -> None:
        if adapter.removed and not adapter.num_requests:
            if adapter.slot is not None:
                slot = self._evict(name)
                assert self._loader is not None
                self._loader.clear(slot)
            del self._adapters[name]
            self._publish()

    # ---- observation ---------------------------------------------------------------

    @property
    def num_resident(self) -> int:
        """Adapters in a slot now."""
        return len(self._lru)

    @property
    def mean_load_ms(self) -> float | None:
        """Mean measured load time, None before the first load."""
        return 1000 * self.load_seconds_total / self.num_loads if self.num_loads else None

    def _publish(self) -> None:
        self.published = tuple(
            AdapterInfo(name, a.spec.digest, a.namespace.hex(), a.slot is not None, a.spec.path)
            for name, a in self._adapters.items() if not a.removed)

    def check_invariants(self) -> None:
        """Slots and LRU agree with the adapters; no count is negative."""
        for slot, name in enumerate(self._slots):
            if name is not None:
                assert self._adapters[name].slot == slot, f"slot {slot} of {name}"
        resident = {n for n, a in self._adapters.items() if a.slot is not None}
        assert resident == set(self._lru), "LRU and residency disagree"
        for name, adapter in self._adapters.items():
            assert 0 <= adapter.num_admitted <= adapter.num_requests, f"{name}: counts"
            assert adapter.slot is not None or not adapter.num_admitted, f"{name}: pinned nowhere"
