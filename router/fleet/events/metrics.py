"""The Prometheus metrics of the KV event followers, shared by both kinds.

vLLM followers (``router.fleet.events.vllm.follower``) count every one of the
counters; radix workers' followers (``router.fleet.events.follower``) count their
decode errors and restarts (their position, connects and resyncs are in
``GET /admin/index``). The two gauges of each followed worker's trust
(``router.fleet.events.health``) are read from the workers at scrape time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from router.fleet.worker_state import WorkerState

# message: frames or seq unreadable; payload: not a batch; event: an event's fields do not
# fit; conflict: a stored block this worker already holds under another hash
MALFORMED_REASONS = ("message", "payload", "event", "conflict")
_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class KVEventMetrics:
    """Counters of every worker's event stream, labelled by worker:
    ``router_kv_events_total`` (batches applied), ``router_kv_event_gaps_total``,
    ``router_kv_event_replays_total``, ``router_kv_event_resyncs_total`` (the worker's
    entries cleared), ``router_kv_event_decode_errors_total`` (malformed messages,
    events, lines or frames, skipped or resynced from),
    ``router_kv_event_follower_restarts_total`` (a follower started over after an
    error that would have ended it), ``router_kv_event_malformed_total{worker,reason}``
    (what a vLLM follower skipped, by ``MALFORMED_REASONS``) and the lag from the engine's batch timestamp to
    the index, ``router_kv_event_lag_seconds``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

        def counter(name: str, text: str) -> Counter:
            return Counter(name, text, ["worker"], registry=registry)

        self.events = counter("router_kv_events", "KV event batches applied to the index")
        self.gaps = counter("router_kv_event_gaps", "Gaps seen in a worker's event sequence")
        self.replays = counter("router_kv_event_replays", "Replays asked of a worker")
        self.resyncs = counter("router_kv_event_resyncs",
                               "Times a worker's index entries were cleared and rebuilt")
        self.decode_errors = counter("router_kv_event_decode_errors",
                                     "Malformed KV event messages, events, lines or frames")
        self.restarts = counter("router_kv_event_follower_restarts",
                                "Followers started over after an error that ended them")
        self.malformed = Counter("router_kv_event_malformed", "KV event input skipped, by "
                                 "reason (vLLM followers)", ["worker", "reason"],
                                 registry=registry)
        self.lag = Histogram("router_kv_event_lag_seconds",
                             "Engine batch timestamp to applied in the index",
                             buckets=_LAG_BUCKETS, registry=registry)

    def follow_workers(self, workers: Callable[[], Iterable[WorkerState]]) -> None:
        """Export, for each of ``workers()`` with an event stream,
        ``router_worker_index_stale{worker}`` (1 while it is routed stale, else 0) and
        ``router_worker_event_stream_age_seconds{worker}`` (since its stream last
        delivered an event or heartbeat; absent until it is first followed)."""
        self._registry.register(_StreamCollector(workers))


class _StreamCollector(Collector):
    """The trust gauges of every worker with an event stream, at scrape time."""

    def __init__(self, workers: Callable[[], Iterable[WorkerState]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._workers = workers
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        """Two families, one sample per worker each."""
        stale = GaugeMetricFamily("router_worker_index_stale", "1 while the worker's KV "
                                  "event stream is silent, broken or being rebuilt and its "
                                  "exact index entries are not trusted", labels=["worker"])
        age = GaugeMetricFamily("router_worker_event_stream_age_seconds", "Seconds since "
                                "the worker's KV event stream delivered an event or "
                                "heartbeat (vLLM's has no heartbeat)", labels=["worker"])
        now = self._clock()
        for worker in self._workers():
            if not worker.has_event_stream:
                continue
            stale.add_metric([worker.worker_id], float(worker.index_mode == "stale"))
            if worker.events_heard_at is not None:
                age.add_metric([worker.worker_id], now - worker.events_heard_at)
        yield stale
        yield age
