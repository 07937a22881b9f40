"""Engine metrics: a frozen ``EngineStats`` snapshot and its Prometheus exposition.

The engine thread builds an ``EngineStats`` after every step and publishes it by
swapping one reference; the event loop (``/info``, ``/metrics``) only reads the
latest snapshot, so no lock is held across threads. Histograms (latencies and
lengths) are observed on the engine thread (prometheus_client histograms are
thread-safe).
Everything registers in a per-process ``CollectorRegistry`` passed in, never the
global default registry.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from workers.kv.manager import KVCacheManager, KVCacheStats

_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5,
    0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 40.0,
)
_TOKEN_COUNT_BUCKETS = (
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000,
)
# Upper bounds (tokens) of the ``prompt_len_bucket`` label of the TTFT histogram.
PROMPT_LEN_BOUNDS = (128, 512, 2048, 8192, 32768)


@dataclass(frozen=True)
class EngineStats:
    """Load and KV-cache numbers at one instant (counters are totals since start)."""

    num_requests_running: int
    num_requests_waiting: int
    num_waiting_tokens: int
    kv_blocks_total: int
    kv_blocks_free: int
    kv_blocks_cached: int
    prefix_cache_queries_tokens_total: int
    prefix_cache_hit_tokens_total: int
    kv_evicted_blocks_total: int
    cow_copies_total: int
    preemptions_total: int
    engine_stalls_total: int
    engine_failed_steps_total: int
    engine_out_of_memory_total: int
    prompt_tokens_total: int
    generation_tokens_total: int
    kv_tail_block_fill_ratio: float
    num_kv_tail_empty_slots: int
    preemption_swaps_total: int
    kv_host_blocks_total: int
    kv_host_blocks_used: int
    kv_host_hit_blocks_total: int
    kv_host_bytes_to_host_total: int
    kv_host_bytes_to_device_total: int
    kv_host_auth_failures_total: int
    kv_host_blocks_to_host_total: int
    kv_host_expired_blocks_total: int
    kv_disk_blocks_total: int
    kv_disk_blocks_used: int
    kv_disk_hit_blocks_total: int
    kv_disk_bytes_written_total: int
    kv_disk_bytes_read_total: int
    kv_disk_auth_failures_total: int

    @property
    def kv_cache_usage_ratio(self) -> float:
        """Fraction of blocks held by running sequences (cached blocks are reclaimable)."""
        used = self.kv_blocks_total - self.kv_blocks_free - self.kv_blocks_cached
        return used / self.kv_blocks_total

    @classmethod
    def collect(
        cls,
        manager: KVCacheManager,
        *,
        num_requests_running: int,
        num_requests_waiting: int,
        num_waiting_tokens: int,
        num_preemptions: int,
        num_swaps: int,
        num_stalls: int,
        num_failed_steps: int,
        num_out_of_memory: int,
        num_prompt_tokens: int,
        num_generation_tokens: int,
        tail_fill: TailBlockFill,
    ) -> EngineStats:
        """Read the KV manager's gauges and counters (engine thread only)."""
        return cls(
            num_requests_running=num_requests_running,
            num_requests_waiting=num_requests_waiting,
            num_waiting_tokens=num_waiting_tokens,
            preemptions_total=num_preemptions,
            engine_stalls_total=num_stalls,
            engine_failed_steps_total=num_failed_steps,
            engine_out_of_memory_total=num_out_of_memory,
            prompt_tokens_total=num_prompt_tokens,
            generation_tokens_total=num_generation_tokens,
            kv_tail_block_fill_ratio=tail_fill.fill_ratio,
            num_kv_tail_empty_slots=tail_fill.num_empty_slots,
            preemption_swaps_total=num_swaps,
            **_kv_cache_fields(manager.stats()),
        )

    @property
    def load_key(self) -> tuple[int, int, int, int]:
        """What a router routes by, to the whole percent of KV usage: the worker pushes
        its load when this changes (``workers.server.load_push``)."""
        return (self.num_requests_running, self.num_requests_waiting,
                self.num_waiting_tokens, round(100 * self.kv_cache_usage_ratio))

    def load(self) -> dict[str, float]:
        """The ``load`` object of ``GET /info``."""
        return {
            "num_requests_running": self.num_requests_running,
            "num_requests_waiting": self.num_requests_waiting,
            "num_waiting_tokens": self.num_waiting_tokens,
            "kv_cache_usage_ratio": self.kv_cache_usage_ratio,
        }


def _kv_cache_fields(kv: KVCacheStats) -> dict[str, int]:
    """``EngineStats``' fields read from the KV manager: device, host and disk tiers."""
    return {
        "kv_blocks_total": kv.num_total_blocks,
        "kv_blocks_free": kv.num_free_blocks,
        "kv_blocks_cached": kv.num_cached_blocks,
        "prefix_cache_queries_tokens_total": kv.prefix_cache_queries_tokens_total,
        "prefix_cache_hit_tokens_total": kv.prefix_cache_hit_tokens_total,
        "kv_evicted_blocks_total": kv.num_evicted_blocks_total,
        "cow_copies_total": kv.num_cow_copies_total,
        "kv_host_blocks_total": kv.host.num_host_blocks_total,
        "kv_host_blocks_used": kv.host.num_host_blocks_used,
        "kv_host_hit_blocks_total": kv.host.host_hit_blocks_total,
        "kv_host_bytes_to_host_total": kv.host.host_bytes_to_host_total,
        "kv_host_bytes_to_device_total": kv.host.host_bytes_to_device_total,
        "kv_host_auth_failures_total": kv.host.host_auth_failures_total,
        "kv_host_blocks_to_host_total": kv.host.host_blocks_to_host_total,
        "kv_host_expired_blocks_total": kv.host.host_expired_blocks_total,
        "kv_disk_blocks_total": kv.disk.num_disk_blocks_total,
        "kv_disk_blocks_used": kv.disk.num_disk_blocks_used,
        "kv_disk_hit_blocks_total": kv.disk.disk_hit_blocks_total,
        "kv_disk_bytes_written_total": kv.disk.disk_bytes_written_total,
        "kv_disk_bytes_read_total": kv.disk.disk_bytes_read_total,
        "kv_disk_auth_failures_total": kv.disk.disk_auth_failures_total,
    }


@dataclass(frozen=True)
class TailBlockFill:
    """Internal fragmentation of the paged pool: how full the last block of each
    running sequence's block table is (every other block of a table is full).

    ``num_empty_slots``: token slots of those last blocks that hold no token (a block
    shared by forked sequences counts once per sequence). ``fill_ratio``: the mean,
    over running sequences, of the share of the last block's slots holding tokens;
    1.0 (nothing wasted) when no sequence runs.
    """

    fill_ratio: float
    num_empty_slots: int

    @classmethod
    def measure(cls, num_tokens_and_blocks: list[tuple[int, int]], block_size: int
                ) -> TailBlockFill:
        """From ``(tokens, blocks held)`` per running sequence; a token without its
        block yet (sampled, not computed) counts as filling nothing."""
        if not num_tokens_and_blocks:
            return cls(1.0, 0)
        empty = sum(b * block_size - min(t, b * block_size) for t, b in num_tokens_and_blocks)
        return cls(1.0 - empty / (len(num_tokens_and_blocks) * block_size), empty)


_GAUGES = {
    "num_requests_running": "Requests holding KV blocks.",
    "num_requests_waiting": "Requests queued for admission (new or preempted).",
    "num_waiting_tokens": "Prompt tokens queued for prefill.",
    "kv_blocks_total": "KV blocks preallocated.",
    "kv_blocks_free": "KV blocks on the free list.",
    "kv_blocks_cached": "KV blocks held only by the prefix cache (evictable).",
    "kv_tail_block_fill_ratio": "Mean share of the slots of running sequences' last KV"
    " block that hold tokens (1: no slot wasted; 1 when nothing runs).",
    "num_kv_tail_empty_slots": "Token slots left empty in the last KV block of running"
    " sequences (internal fragmentation; a shared block counts once per sequence).",
    "kv_host_blocks_total": "KV blocks the host-memory tier holds at most (0: no tier).",
    "kv_host_blocks_used": "KV blocks in the host-memory tier.",
    "kv_disk_blocks_total": "KV blocks the disk tier holds at most (0: no tier).",
    "kv_disk_blocks_used": "KV blocks in the disk tier.",
}
_COUNTERS = {
    "prefix_cache_queries_tokens_total": "Prompt tokens looked up in the prefix cache.",
    "prefix_cache_hit_tokens_total": "Prompt tokens found in the prefix cache.",
    "kv_evicted_blocks_total": "KV blocks evicted from the prefix cache.",
    "cow_copies_total": "KV blocks copied on write.",
    "preemptions_total": "Sequences preempted for lack of KV blocks.",
    "preemption_swaps_total": "Preemptions that swapped the sequence to the host tier.",
    "kv_host_hit_blocks_total": "KV blocks copied back from the host tier on a prefix hit.",
    "kv_host_bytes_to_host_total": "KV bytes copied from the device to the host tier.",
    "kv_host_bytes_to_device_total": "KV bytes copied from the host tier to the device.",
    "kv_host_auth_failures_total": "Host-tier blocks that failed authentication (dropped).",
    "kv_host_blocks_to_host_total": "KV blocks copied from the device to the host tier.",
    "kv_host_expired_blocks_total": "Host-tier blocks dropped because their TTL ran out.",
    "kv_disk_hit_blocks_total": "KV blocks read back from the disk tier on a prefix hit.",
    "kv_disk_bytes_written_total": "Bytes of block files written to the disk tier.",
    "kv_disk_bytes_read_total": "Bytes of block files read from the disk tier (scan and hits).",
    "kv_disk_auth_failures_total": "Disk-tier block files that could not be read or failed"
    " authentication (torn, tampered, another secret; dropped).",
    "engine_stalls_total": "Requests that could not be admitted with nothing running (a bug).",
    "engine_failed_steps_total": "Batched engine steps that raised; every request in flight"
    " failed with the step.",
    "engine_out_of_memory_total": "torch.OutOfMemoryError (CUDA out of memory) caught by the"
    " engine: each that failed a step, a batched sampling or one request.",
    "prompt_tokens_total": "Prompt tokens of requests whose prefill completed (cached or not).",
    "generation_tokens_total": "Output tokens generated (all choices, aborted requests too).",
}


class _StatsCollector(Collector):
    """Exposes the latest published ``EngineStats`` at scrape time."""

    def __init__(self, read: Callable[[], EngineStats]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        stats = self._read()
        for name, doc in _GAUGES.items():
            yield GaugeMetricFamily(name, doc, value=getattr(stats, name))
        yield GaugeMetricFamily(
            "kv_cache_usage_ratio",
            "Fraction of KV blocks held by running sequences.",
            value=stats.kv_cache_usage_ratio,
        )
        for name, doc in _COUNTERS.items():
            yield CounterMetricFamily(name, doc, value=getattr(stats, name))


class EngineMetrics:
    """Latency and length histograms in ``registry``, observed by the engine thread.

    ``time_to_first_token_seconds`` and ``time_per_output_token_seconds`` carry a
    ``prompt_len_bucket`` label: the smallest bound of ``PROMPT_LEN_BOUNDS`` the
    prompt fits in, or ``+Inf``; every child exists from the start (sum over the
    label for the overall figure).
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        ttft = Histogram(
            "time_to_first_token_seconds",
            "Arrival to first output token, per request choice, by prompt length.",
            ["prompt_len_bucket"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        tpot = Histogram(
            "time_per_output_token_seconds",
            "Interval between consecutive output tokens of a choice, by prompt length.",
            ["prompt_len_bucket"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        labels = [str(bound) for bound in PROMPT_LEN_BOUNDS] + ["+Inf"]
        self._ttft_by_prompt_len = [ttft.labels(label) for label in labels]
        self._tpot_by_prompt_len = [tpot.labels(label) for label in labels]
        self._prompt_len = Histogram(
            "request_prompt_tokens",
            "Prompt length of each finished request, in tokens.",
            buckets=_TOKEN_COUNT_BUCKETS,
            registry=registry,
        )
        self._output_len = Histogram(
            "request_generation_tokens",
            "Output tokens of each finished request (all choices).",
            buckets=_TOKEN_COUNT_BUCKETS,
            registry=registry,
        )

    def observe_ttft(self, seconds: float, num_prompt_tokens: int) -> None:
        """Record one time to first token of a prompt of ``num_prompt_tokens``."""
        bucket = bisect.bisect_left(PROMPT_LEN_BOUNDS, num_prompt_tokens)
        self._ttft_by_prompt_len[bucket].observe(seconds)

    def observe_tpot(self, seconds: float, num_prompt_tokens: int) -> None:
        """Record one inter-token interval of a choice whose prompt has
        ``num_prompt_tokens``."""
        bucket = bisect.bisect_left(PROMPT_LEN_BOUNDS, num_prompt_tokens)
        self._tpot_by_prompt_len[bucket].observe(seconds)

    def observe_finished(self, num_prompt_tokens: int, num_output_tokens: int) -> None:
        """Record the lengths of one request that finished (not aborted or failed)."""
        self._prompt_len.observe(num_prompt_tokens)
        self._output_len.observe(num_output_tokens)


def register_stats(registry: CollectorRegistry, read_stats: Callable[[], EngineStats]) -> None:
    """Expose the gauges and counters of ``read_stats()`` (called at each scrape)."""
    registry.register(_StatsCollector(read_stats))
