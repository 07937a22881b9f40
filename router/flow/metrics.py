"""Flow control's Prometheus metrics, on the router's registry (docs/flow-control.md).

Labels are bands (from the config) and tenants (configured ids only); a fairness
id from a header never becomes a label value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

SHED_REASONS = ("ttl", "queue_full")
_QUEUE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                  120.0)


class FlowMetrics:
    """Queue depth per band, time in queue per band and tenant, dispatches, sheds by
    reason, requests whose client left while queued, and Jain's index of the weighted
    token shares dispatched over the recent window."""

    def __init__(self, registry: CollectorRegistry, bands: Sequence[str],
                 num_queued: Callable[[int], int], jain_index: Callable[[], float]) -> None:
        depth = Gauge("router_flow_queued_requests", "Requests waiting in the router, by band",
                      ["band"], registry=registry)
        for i, band in enumerate(bands):
            depth.labels(band).set_function(lambda i=i: num_queued(i))
        self.queue_seconds = Histogram("router_flow_queue_seconds", "Time a request waited in "
                                       "the router before dispatch or shedding",
                                       ["band", "tenant"], buckets=_QUEUE_BUCKETS,
                                       registry=registry)
        self.dispatched = Counter("router_flow_dispatched", "Requests sent on by flow control",
                                  ["band", "tenant"], registry=registry)
        self.shed = Counter("router_flow_shed", "Requests refused by flow control (429), by "
                            "reason", ["band", "reason"], registry=registry)
        self.cancelled = Counter("router_flow_cancelled", "Requests whose client went away "
                                 "while they waited", ["band"], registry=registry)
        for band in bands:
            self.cancelled.labels(band)
            for reason in SHED_REASONS:
                self.shed.labels(band, reason)
        jain = Gauge("router_flow_jain_fairness", "Jain's fairness index of the weighted "
                     "tokens dispatched per fairness id over the recent window", registry=registry)
        jain.set_function(jain_index)
