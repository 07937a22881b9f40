"""The transfer's Prometheus metrics, on the worker's registry (docs/pd.md)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

FAILURE_REASONS = ("unreachable", "timeout", "refused", "mismatch", "evicted", "protocol",
                   "unauthenticated", "oversized", "public_prefix")
# Why the transfer port closed a connection without serving it (docs/pd.md).
PORT_REFUSAL_REASONS = ("unauthenticated", "oversized", "protocol", "timeout", "busy",
                        "error")
RELEASE_REASONS = ("acknowledged", "abandoned")
HOLD_CAPS = ("producer", "scope")
MAX_SCOPE_LABELS = 1000  # held block-seconds beyond this many scopes are charged to "other"
_PULL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class TransferMetrics:
    """Blocks and bytes sent and received, pull latency, failures by reason (every
    reason exists from the start), recomputes chosen by ``fallback``, the blocks held
    for consumers with the oldest hold's age, and how holds end: released (by the
    consumer's ack or the router's release of an abandoned one), expired, refused over
    a cap; pins freed because their owner was cancelled, orphans the sweep freed,
    acks a producer never answered, and held block-seconds per tenant scope."""

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
        self._add_hold_lifecycle(registry)

    def _add_hold_lifecycle(self, registry: CollectorRegistry) -> None:
        self.released = Counter("kv_transfer_released_holds", "Held transfers released "
                                "before their deadline: acknowledged by the consumer, or "
                                "abandoned (released by the router)", ["reason"],
                                registry=registry)
        for reason in RELEASE_REASONS:
            self.released.labels(reason)
        self.refused = Counter("kv_transfer_refused_holds", "Prefill legs refused (429) "
                               "because their hold would pass a cap", ["cap"],
                               registry=registry)
        for cap in HOLD_CAPS:
            self.refused.labels(cap)
        self.cancelled_pins = Counter("kv_transfer_cancelled_pins", "Holds and imports "
                                      "whose owner was cancelled or failed while the "
                                      "engine pinned them, freed behind the pin",
                                      registry=registry)
        self.orphan_pins = Counter("kv_transfer_orphan_pins_freed", "Pins the engine held "
                                   "that no hold or import owned, freed by the sweep "
                                   "(expected 0)", registry=registry)
        self.ack_failures = Counter("kv_transfer_ack_failures", "Acknowledgements the "
                                    "producer did not answer in ack_timeout_s",
                                    registry=registry)
        self.peer_holds = Counter("kv_transfer_peer_holds", "Holds a router asked for "
                                  "without a prefill leg (POST /kv_transfer/hold), answered",
                                  registry=registry)
        self.peer_held_blocks = Counter("kv_transfer_peer_held_blocks", "Blocks those holds "
                                        "named", registry=registry)
        self.max_held_blocks = Gauge("kv_transfer_max_held_blocks", "Most blocks this "
                                     "producer holds for consumers at once (its cap)",
                                     registry=registry)
        self._held_block_seconds = Counter(
            "kv_transfer_held_block_seconds", "Blocks held for consumers times seconds "
            "held, per tenant scope (charged when the hold ends)", ["scope"],
            registry=registry)
        self._scopes: set[str] = set()

    def charge(self, scope: str, block_seconds: float) -> None:
        """Add ``block_seconds`` to ``scope``'s held block-seconds; past
        ``MAX_SCOPE_LABELS`` distinct scopes, a new one is charged as ``other``."""
        if scope not in self._scopes:
            if len(self._scopes) >= MAX_SCOPE_LABELS:
                scope = "other"
            self._scopes.add(scope)
        self._held_block_seconds.labels(scope).inc(block_seconds)
