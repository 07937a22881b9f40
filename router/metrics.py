"""The router's Prometheus metrics, on a per-app ``CollectorRegistry`` (no globals).

Counters and histograms are updated as requests pass; the gauges (index size, worker
readiness and load) are refreshed from their owners when ``/metrics`` is scraped. A
stream that fails after its first byte (an error frame, then ``[DONE]``) is counted
in ``router_requests_total`` with code 502, like an error before it. A refused
request is counted in ``router_refused_requests_total`` too, by its reason. The
process's own ``process_*`` metrics (resident memory, CPU, file descriptors) are read
from ``/proc`` at each scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import NamedTuple

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from radix.api_errors import ApiError
from radix.token_cache import CacheStats
from router.fleet.cache_prediction import OUTCOMES
from router.fleet.discovery.status import DiscoveryStatus
from router.fleet.events.metrics import KVEventMetrics
from router.fleet.expectations import EXPECT_FIELDS
from router.fleet.load_state import UNKNOWN
from router.fleet.registry import WorkerState
from router.routing.index import IndexStats
from router.siblings.protocol import Siblings

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                    1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_DECISION_BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001,
                     0.0025, 0.005, 0.01)
# The ``reason`` of ``router_refused_requests_total``: the error code of each refusal
# the router makes itself (``front/auth``, ``client``, ``front/limits``, ``dispatch``,
# and the lean server's own: ``framing_too_large``, its head and URL limits),
# and ``invalid_request`` for any other 4xx (a malformed body, an unknown model, a
# client error a worker found). Every child exists from the start.
REFUSAL_REASONS = ("invalid_api_key", "invalid_request", "request_too_large",
                   "framing_too_large", "request_timeout", "max_tokens_too_large", "prompt_too_long",
                   "concurrency_limit", "rate_limit_exceeded", "no_worker", "saturated")


PD_MODES = ("disaggregated", "aggregated", "fallback")


class RouterMetrics:
    """All router metrics (names in docs/operations.md, Monitoring). One instance per app."""

    def __init__(self, token_cache_stats: Callable[[], Mapping[str, CacheStats]] = dict,
                 index_stats: Callable[[], IndexStats] | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        r.register(_TokenCacheCollector(token_cache_stats))
        if index_stats is not None:
            r.register(_IndexCollector(index_stats))
        self.requests = Counter("router_requests", "Requests by worker, tenant and status code",
                                ["worker", "tenant", "code"], registry=r)
        self.prompt_tokens = Counter("router_prompt_tokens", "Prompt tokens routed, by worker",
                                     ["worker"], registry=r)
        self.matched_tokens = Counter("router_matched_tokens",
                                      "Prompt tokens the index matched on the chosen worker",
                                      ["worker"], registry=r)
        self.decision_seconds = Histogram("router_decision_seconds",
                                          "Time to match and choose a worker",
                                          buckets=_DECISION_BUCKETS, registry=r)
        self.worker_ready = Gauge("router_worker_ready",
                                  "1 while the worker passes its readiness probe and is routed to",
                                  ["worker"], registry=r)
        self.worker_exact = Gauge("router_worker_index_exact",
                                  "1 while the worker is routed from its KV events, 0 while "
                                  "approximately (no events, or its tokenization differs) "
                                  "or stale (its event stream silent or being rebuilt)",
                                  ["worker"], registry=r)
        self.worker_expectations = Gauge(
            "router_worker_expectation_mismatch", "1 while the worker's last probe found "
            "this field of its model's expect table unmet (it is not routed), else 0",
            ["worker", "field"], registry=r)
        self.worker_load = Gauge("router_worker_load", "Worker load as the router sees it",
                                 ["worker", "measure"], registry=r)
        self.worker_load_age = Gauge("router_worker_load_age_seconds",
                                     "Seconds since the worker's load last came in (a load "
                                     "frame on its KV event stream, or a probe)",
                                     ["worker"], registry=r)
        self.worker_load_unknown = Gauge("router_worker_load_unknown",
                                         "1 while the worker's pushed load is unknown (its "
                                         "KV event stream silent, ended or reconnecting)",
                                         ["worker"], registry=r)
        self.request_seconds = Histogram("router_request_seconds", "Whole request latency",
                                         buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft_seconds = Histogram("router_ttft_seconds", "Time to the first byte sent",
                                      buckets=_LATENCY_BUCKETS, registry=r)
        self.retries = Counter("router_retries", "Attempts moved to another worker", registry=r)
        pd = Counter("router_pd_requests", "Requests to models with prefill/decode roles, by "
                     "how they ran: disaggregated, aggregated (few uncached tokens, n > 1, an "
                     "adapter, no prefill worker) or fallback (the prefill leg failed)",
                     ["mode"], registry=r)
        self.pd_requests = {mode: pd.labels(mode) for mode in PD_MODES}
        refused = Counter("router_refused_requests",
                          "Requests refused (4xx, 503 no_worker or saturated), by reason",
                          ["reason"], registry=r)
        self._refusals = {reason: refused.labels(reason) for reason in REFUSAL_REASONS}
        self.kv_events = KVEventMetrics(r)
        self.cache_prediction_tokens = Counter(
            "router_cache_prediction_tokens", "Prompt tokens of the checked requests the index "
            "predicted cached on the chosen worker (predicted), the part of it only requests "
            "in flight vouched for (in_flight) and the worker served from its cache (served), "
            "all in whole blocks", ["worker", "kind"], registry=r)
        self.cache_predictions = Counter(
            "router_cache_predictions", "Requests whose predicted cached tokens were checked "
            "against the worker's cached_tokens, by outcome: exact, over (served less than "
            "the confirmed prediction: a silent miss), under (served more), in_flight (served "
            "less than predicted, only by what requests in flight vouched for)",
            ["worker", "namespace", "outcome"], registry=r)
        self._request_counters: dict[tuple[str, str, int], Counter] = {}
        self._token_counters: dict[str, tuple[Counter, Counter]] = {}
        self._prediction_counters: dict[str, _PredictionCounters] = {}

    def follow_siblings(self, siblings: Siblings) -> None:
        """Expose what several routers share: ``router_shared_state_up`` (1 while the
        shared state is reachable; always 1 without Redis: state is local) and
        ``router_shared_entries_refused_total``."""
        self.registry.register(_SiblingsCollector(siblings))

    def follow_discovery(self, status: DiscoveryStatus) -> None:
        """Expose discovery (docs/kubernetes.md): ``router_discovery_up`` (1 from a
        successful LIST until the next error), ``router_discovery_pods`` (pods serving
        now), ``router_discovery_skipped`` (endpoints not registered),
        ``router_discovery_lists_total``, ``router_discovery_events_total``,
        ``router_discovery_errors_total`` by reason and
        ``router_discovery_refused_pods_total`` by reason (owner, service_account,
        role)."""
        self.registry.register(_DiscoveryCollector(status))

    def count_request(self, worker_id: str, tenant_id: str, code: int) -> None:
        """Count one finished request in ``router_requests_total``. The labelled child
        is cached (as many as Prometheus itself keeps): ``labels()`` takes a lock and
        builds its key, several times the cost of the increment."""
        key = (worker_id, tenant_id, code)
        counter = self._request_counters.get(key)
        if counter is None:
            counter = self._request_counters[key] = self.requests.labels(worker_id, tenant_id,
                                                                         str(code))
        counter.inc()

    def count_refusal(self, error: ApiError) -> None:
        """Count a request answered with ``error`` in ``router_refused_requests_total``
        when ``error`` is a refusal: under its code when that is one of
        ``REFUSAL_REASONS``, else under ``invalid_request`` when it is a 4xx. Any other
        5xx (502: the worker failed) is a failure, not a refusal: not counted."""
        counter = self._refusals.get(error.code or "")
        if counter is None and error.status < 500:
            counter = self._refusals["invalid_request"]
        if counter is not None:
            counter.inc()

    def count_tokens(self, worker_id: str, num_prompt_tokens: int, num_matched_tokens: int
                     ) -> None:
        """Count one routed prompt and the index's predicted match on ``worker_id`` (the
        labelled children are cached, as in ``count_request``)."""
        counters = self._token_counters.get(worker_id)
        if counters is None:
            counters = self._token_counters[worker_id] = (
                self.prompt_tokens.labels(worker_id), self.matched_tokens.labels(worker_id))
        counters[0].inc(num_prompt_tokens)
        counters[1].inc(num_matched_tokens)

    def count_prediction(self, worker_id: str, namespace: str, outcome: str,
                         num_predicted_tokens: int, num_in_flight_tokens: int,
                         num_served_tokens: int) -> None:
        """Count one checked prediction (``router.fleet.cache_prediction``) of
        ``worker_id`` in base namespace ``namespace``: its outcome in
        ``router_cache_predictions_total`` and its tokens in
        ``router_cache_prediction_tokens_total``. A worker's children are made at its
        first check, every outcome at once (so each is exported from then on), and
        cached (as in ``count_request``) until its namespace changes."""
        counters = self._prediction_counters.get(worker_id)
        if counters is None or counters.namespace != namespace:
            counters = self._prediction_counters[worker_id] = _PredictionCounters(
                namespace,
                {name: self.cache_predictions.labels(worker_id, namespace, name)
                 for name in OUTCOMES},
                self.cache_prediction_tokens.labels(worker_id, "predicted"),
                self.cache_prediction_tokens.labels(worker_id, "in_flight"),
                self.cache_prediction_tokens.labels(worker_id, "served"))
        counters.outcomes[outcome].inc()
        counters.predicted.inc(num_predicted_tokens)
        counters.in_flight.inc(num_in_flight_tokens)
        counters.served.inc(num_served_tokens)

    def render(self, workers: Iterable[WorkerState]) -> bytes:
        """Refresh the gauges and return the Prometheus text exposition."""
        self.worker_load.clear()
        self.worker_ready.clear()
        self.worker_exact.clear()
        self.worker_expectations.clear()
        self.worker_load_age.clear()
        self.worker_load_unknown.clear()
        for worker in workers:
            self.worker_ready.labels(worker.worker_id).set(float(worker.ready))
            self.worker_exact.labels(worker.worker_id).set(float(worker.index_mode == "exact"))
            unmet = {m.field for m in worker.expectation_mismatches}
            for name in EXPECT_FIELDS:
                self.worker_expectations.labels(worker.worker_id, name).set(float(name in unmet))
            self.worker_load_unknown.labels(worker.worker_id).set(
                float(worker.load_state.source == UNKNOWN))
            if (age_s := worker.load_state.age_s()) is not None:
                self.worker_load_age.labels(worker.worker_id).set(age_s)
            for measure, value in _load_measures(worker).items():
                self.worker_load.labels(worker.worker_id, measure).set(value)
        return generate_latest(self.registry)


class _PredictionCounters(NamedTuple):
    """One worker's children of the two prediction counters, for one namespace."""

    namespace: str
    outcomes: dict[str, Counter]
    predicted: Counter
    in_flight: Counter
    served: Counter


class _TokenCacheCollector(Collector):
    """``router_token_cache_chars_total{model, result}``: prompt text characters the
    token cache reused (``reused``) and all it was asked for (``total``)."""

    def __init__(self, stats: Callable[[], Mapping[str, CacheStats]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        """One sample per model and result, read at scrape time."""
        family = CounterMetricFamily("router_token_cache_chars",
                                     "Prompt characters tokenized, and those reused from the cache",
                                     labels=["model", "result"])
        for model, stats in self._stats().items():
            family.add_metric([model, "total"], stats.num_chars)
            family.add_metric([model, "reused"], stats.num_reused_chars)
        yield family


class _SiblingsCollector(Collector):
    """The shared state's reachability and the shared entries refused, at scrape time."""

    def __init__(self, siblings: Siblings) -> None:
        self._siblings = siblings

    def collect(self) -> Iterator[Metric]:
        """Two samples."""
        yield GaugeMetricFamily("router_shared_state_up",
                                "1 while the shared state is reachable (always 1 without "
                                "Redis: state is local)", value=float(self._siblings.up))
        yield CounterMetricFamily("router_shared_entries_refused",
                                  "Shared entries (workers, canary states) this router could "
                                  "not use, each counted once",
                                  value=self._siblings.num_refused_entries)


class _DiscoveryCollector(Collector):
    """Discovery's state and counters, at scrape time."""

    def __init__(self, status: DiscoveryStatus) -> None:
        self._status = status

    def collect(self) -> Iterator[Metric]:
        """Seven families."""
        s = self._status
        yield GaugeMetricFamily("router_discovery_up", "1 from a successful LIST of the "
                                "watched objects until the next error", value=float(s.up))
        yield GaugeMetricFamily("router_discovery_pods", "Discovered pods that serve",
                                value=s.num_pods)
        yield GaugeMetricFamily("router_discovery_skipped", "Discovered endpoints not "
                                "registered (id taken, model unknown, refused)",
                                value=s.num_skipped)
        yield CounterMetricFamily("router_discovery_lists", "Successful LISTs",
                                  value=s.num_lists)
        yield CounterMetricFamily("router_discovery_events", "Watch events applied",
                                  value=s.num_events)
        errors = CounterMetricFamily("router_discovery_errors", "Failed LISTs and WATCHes "
                                     "by reason (each followed by a re-LIST)",
                                     labels=["reason"])
        for reason, count in s.num_errors.items():
            errors.add_metric([reason], count)
        yield errors
        refused = CounterMetricFamily("router_discovery_refused_pods", "Pods with the labels "
                                      "refused by an identity or role check, each once per "
                                      "reason", labels=["reason"])
        for reason, count in s.num_refused.items():
            refused.add_metric([reason], count)
        yield refused


class _IndexCollector(Collector):
    """The index's size and what it dropped, read at scrape time:
    ``router_index_nodes`` (distinct blocks of the exact index),
    ``router_index_evicted_blocks_total`` (dropped by ``index.max_blocks``) and
    ``router_index_orphan_blocks_total`` (stored blocks whose parent was unknown)."""

    def __init__(self, stats: Callable[[], IndexStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        """Three samples."""
        stats = self._stats()
        yield GaugeMetricFamily("router_index_nodes", "Nodes in the router index",
                                value=stats.num_nodes)
        yield CounterMetricFamily("router_index_evicted_blocks",
                                  "Blocks the index dropped to stay within index.max_blocks",
                                  value=stats.num_evicted_blocks)
        yield CounterMetricFamily("router_index_orphan_blocks",
                                  "Stored blocks skipped because their parent was unknown",
                                  value=stats.num_orphan_blocks)


def _load_measures(worker: WorkerState) -> Mapping[str, float]:
    load = worker.load
    return {
        "in_flight_requests": worker.num_in_flight_requests,
        "in_flight_prompt_tokens": worker.num_in_flight_prompt_tokens,
        "requests_running": load.num_requests_running,
        "requests_waiting": load.num_requests_waiting,
        "waiting_tokens": load.num_waiting_tokens,
        "kv_cache_usage_ratio": load.kv_cache_usage_ratio,
    }
