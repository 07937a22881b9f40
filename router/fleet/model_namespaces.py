"""The cache namespaces each model's routable workers are in: a split pool, reported.

Workers of one model whose base namespaces differ (another engine numerics version, KV
dtype, weights, worker kind...) never share an index entry, a transfer or a match:
the router keeps them apart on its own. ``ModelNamespaces`` makes that visible. Each
time the registry rebuilds its routable lists, ``observe`` groups every model's ready,
undrained workers by base namespace digest; a model whose set of namespaces changes
to more than one is logged once as a warning naming the workers and the fields that
differ, and once at INFO when it is back to one. ``GET /admin/workers`` shows the
groups (``to_dict``) and ``/metrics`` exports ``router_model_namespaces{model}``: the
number of distinct base namespaces among the model's routable workers (1 in a healthy
pool, 0 while none is ready).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import fields

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from radix.namespace import CacheNamespace
from router.fleet.worker_state import WorkerState

log = logging.getLogger(__name__)


class ModelNamespaces(Collector):
    """Per configured model, its routable workers by base namespace digest; a
    Prometheus collector of ``router_model_namespaces``."""

    def __init__(self, models: Iterable[str]) -> None:
        self._groups: dict[str, dict[str, list[WorkerState]]] = {m: {} for m in models}

    def observe(self, routable: Mapping[str, Sequence[WorkerState]]) -> None:
        """Regroup from ``routable`` (model -> its ready, undrained workers); log each
        model whose set of namespaces changed into or out of a split."""
        for model in set(self._groups) | set(routable):
            groups: dict[str, list[WorkerState]] = {}
            for worker in routable.get(model, ()):
                groups.setdefault(worker.namespace or "", []).append(worker)
            before = self._groups.get(model, {})
            self._groups[model] = groups
            if set(groups) == set(before):
                continue
            if len(groups) > 1:
                log.warning("model %s: its ready workers are in %d cache namespaces, kept "
                            "apart (no shared index entries or transfers): %s; they differ "
                            "in %s (docs/operations.md, Split pools)", model, len(groups),
                            _describe(groups), ", ".join(differing_fields(groups)) or "unknown")
            elif len(before) > 1:
                log.info("model %s: its ready workers are in one cache namespace again", model)

    def num_namespaces(self, model: str) -> int:
        """Distinct base namespaces among ``model``'s routable workers."""
        return len(self._groups.get(model, {}))

    def to_dict(self) -> dict[str, object]:
        """Per model: ``num_namespaces`` and, per namespace digest, its workers and the
        namespace fields (None for a kind whose namespace the router builds itself)."""
        return {model: {"num_namespaces": len(groups),
                        "namespaces": {digest: _group_dict(workers)
                                       for digest, workers in groups.items()}}
                for model, groups in self._groups.items()}

    def collect(self) -> Iterator[Metric]:
        """``router_model_namespaces{model}``, every configured model."""
        family = GaugeMetricFamily(
            "router_model_namespaces", "Distinct base cache namespaces among the model's "
            "ready workers: 1 in a healthy pool, more when its workers cannot share KV",
            labels=["model"])
        for model, groups in self._groups.items():
            family.add_metric([model], len(groups))
        yield family


def differing_fields(groups: Mapping[str, Sequence[WorkerState]]) -> list[str]:
    """The ``CacheNamespace`` fields whose values differ between the groups (of the
    workers whose fields the router knows), in declaration order."""
    known = [w[0].cache_namespace for w in groups.values() if w[0].cache_namespace is not None]
    return [f.name for f in fields(CacheNamespace)
            if len({getattr(namespace, f.name) for namespace in known}) > 1]


def _group_dict(workers: Sequence[WorkerState]) -> dict[str, object]:
    namespace = workers[0].cache_namespace
    return {"workers": [w.worker_id for w in workers],
            "fields": None if namespace is None else namespace.to_dict()}


def _describe(groups: Mapping[str, Sequence[WorkerState]]) -> str:
    return "; ".join(f"{digest[:12]}: {', '.join(w.worker_id for w in workers)}"
                     for digest, workers in groups.items())
