"""Reading one sample out of a Prometheus text exposition (a ``/metrics`` answer), and
out of a worker's or router process's own."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families

from harness.procs import ManagedProcess, http_json


def sample(text: object, name: str, labels: Mapping[str, str] | None = None) -> float:
    """The value of the sample ``name`` (``..._total`` for a counter) with exactly
    ``labels`` (None: the first sample of that name); AssertionError when none is."""
    for family in text_string_to_metric_families(str(text)):
        for found in family.samples:
            if found.name == name and (labels is None or found.labels == dict(labels)):
                return found.value
    raise AssertionError(f"no sample {name} {dict(labels or {})}")


def worker_metric(worker: ManagedProcess, name: str, labels: Mapping[str, str] | None = None
                  ) -> float:
    """One sample of ``worker``'s ``/metrics`` (with its key)."""
    return sample(worker.get_json("/metrics")[1], name, labels)


def router_metric(router: ManagedProcess, name: str, labels: Mapping[str, str] | None = None
                  ) -> float:
    """One sample of the router's ``/metrics`` (on its own listen address)."""
    return sample(http_json("GET", f"{router.metrics_url}/metrics")[1], name, labels)
