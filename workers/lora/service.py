"""A worker's LoRA side as the HTTP layer and the engine see it: the settings, the
shapes adapters must fit, the slots, the adapters' namespaces, and the metrics.

Built once per worker (``build_lora``); with LoRA off it has no slots and every
adapter name is unknown. Adapters are read and checked (``read``) off the engine
thread; registering, unregistering and loading happen on it (``AdapterSlots``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from radix.namespace import CacheNamespace
from workers.config import LoraSettings
from workers.lora.adapters import AdapterSlots, SlotLoader
from workers.lora.peft_files import AdapterError, AdapterSpec, BaseShapes, read_adapter

log = logging.getLogger(__name__)
LOAD_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True)
class LoraService:
    """``settings`` as configured; ``shapes`` the base model's projections (None: this
    backend takes no adapter); ``needs_weights`` False for a timed worker, which
    accepts config-only adapter directories."""

    settings: LoraSettings
    shapes: BaseShapes | None
    needs_weights: bool
    slots: AdapterSlots

    def read(self, name: str, path: str) -> AdapterSpec:
        """The checked adapter ``name`` at ``path`` (AdapterError naming the field)."""
        if not self.settings.enable:
            raise AdapterError("LoRA is not enabled on this worker (--enable-lora)", "lora_name")
        if self.shapes is None:
            raise AdapterError("this model gives no projection shapes for adapters", "lora_path")
        if not name:
            raise AdapterError("lora_name must not be empty", "lora_name")
        return read_adapter(name, path, self.shapes, self.settings.max_lora_rank,
                            self.needs_weights)

    def read_runtime(self, name: str, path: str) -> AdapterSpec:
        """``read`` for a run-time load: only a path under one of ``settings.roots`` (the
        refusal is the same whether the path exists or not)."""
        real = os.path.realpath(path)
        for root in self.settings.roots:
            base = os.path.realpath(root)
            if os.path.commonpath((real, base)) == base:
                return self.read(name, real)
        raise AdapterError("lora_path must be under one of the directories this worker "
                           "loads adapters from (--lora-root)", "lora_path")

    def describe(self) -> dict[str, object]:
        """The ``/ready`` and ``/info`` fields (docs/adapters.md, "The /ready contract")."""
        slots = self.slots
        return {
            "max_loras": slots.max_loras,
            "lora_load_ms": slots.mean_load_ms,
            "adapters": [{"name": a.name, "digest": a.digest, "namespace": a.namespace,
                          "resident": a.resident} for a in slots.published],
        }


def build_lora(settings: LoraSettings, shapes: BaseShapes | None, loader: SlotLoader | None,
               needs_weights: bool, base: CacheNamespace, secret: bytes,
               registry: CollectorRegistry) -> LoraService:
    """The worker's LoRA service with its start-up modules registered; ValueError
    naming the module and the field for an adapter that does not fit."""
    loads = Counter("worker_lora_loads", "LoRA adapter loads into a slot.", registry=registry)
    seconds = Histogram("worker_lora_load_seconds", "Time to load a LoRA adapter into a slot.",
                        buckets=LOAD_SECONDS_BUCKETS, registry=registry)

    def on_load(elapsed_s: float) -> None:
        loads.inc()
        seconds.observe(elapsed_s)

    def namespace_of(spec: AdapterSpec) -> bytes:
        return adapter_namespace(base, spec).digest(secret)

    if settings.enable:
        slots = AdapterSlots(settings.max_loras, loader, namespace_of, on_load,
                             settings.max_registered)
    else:
        slots = AdapterSlots.disabled()
    resident = Gauge("worker_lora_resident_adapters", "LoRA adapters resident in slots now.",
                     registry=registry)
    resident.set_function(lambda: slots.num_resident)
    service = LoraService(settings, shapes, needs_weights, slots)
    for name, path in settings.module_paths():
        try:
            slots.register(service.read(name, path))
        except AdapterError as exc:
            raise ValueError(f"lora.modules {name}: {exc.param}: {exc}") from None
    if settings.enable:
        log.info("LoRA: %d slots of rank %d, %d adapters registered", settings.max_loras,
                 settings.max_lora_rank, len(slots.published))
    return service


def adapter_namespace(base: CacheNamespace, spec: AdapterSpec) -> CacheNamespace:
    """The base model's namespace with the adapter's name and digest: its own tree."""
    return dataclasses.replace(base, adapter_name=spec.name, adapter_digest=spec.digest)
