"""The transfer's Prometheus metrics, on the worker's registry (docs/pd.md)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

FAILURE_REASONS = ("unreachable", "timeout", "refused", "mismatch", "evicted", "protocol",
                   "unauthenticated", "oversized", "public_prefix")
# Why the transfer port closed a connection without serving it (docs/pd.md).
PORT_REFUSAL_REASONS = ("unauthenticated", "oversized", "protocol", "timeout", "busy",
                        "error")
_PULL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class TransferMetrics:
    """Blocks and bytes sent and received, pull latency, failures by reason (every
    reason exists from the start), recomputes chosen by ``fallback``, expired holds,
    and the blocks held for consumers with the oldest hold's age."""

    def __init__(self, registry: CollectorRegistry,
                 held: Callable[[], tuple[int, float]]) -> None:
        self.blocks_sent = Counter("kv_transfer_blocks_sent", "KV blocks sent to consumers",
                                   registry=registry)
        self.bytes_sent = Counter("kv_transfer_bytes_sent", "KV bytes sent to consumers",
                                  registry=registry)
        self.blocks_received = Counter("kv_transfer_blocks_received",
                                       "KV blocks pulled from producers", registry=registry)
        self.bytes_received = Counter("kv_transfer_bytes_received",
                                      "KV bytes pulled from producers", registry=registry)
        self.pull_seconds = Histogram("kv_transfer_pull_seconds", "One pull, connect to ack",
                                      buckets=_PULL_BUCKETS, registry=registry)
        self.failures = Counter("kv_transfer_failures", "Pulls that failed, by reason",
                                ["reason"], registry=registry)
        for reason in FAILURE_REASONS:
            self.failures.labels(reason)
        self.port_refusals = Counter("kv_transfer_port_refusals", "Connections to the "
                                     "transfer port refused before any block was read, "
                                     "by reason", ["reason"], registry=registry)
        for reason in PORT_REFUSAL_REASONS:
            self.port_refusals.labels(reason)
        self.recomputes = Counter("kv_transfer_recomputes", "Requests whose pull failed and "
                                  "that recomputed the prompt (fallback = recompute)",
                                  registry=registry)
        self.expired = Counter("kv_transfer_expired_holds", "Held transfers released at "
                               "their deadline, never acknowledged", registry=registry)
        held_blocks = Gauge("kv_transfer_held_blocks", "KV blocks held for consumers",
                            registry=registry)
        held_blocks.set_function(lambda: held()[0])
        oldest = Gauge("kv_transfer_oldest_hold_seconds", "Age of the oldest held transfer",
                       registry=registry)
        oldest.set_function(lambda: held()[1])
