"""Cluster simulator: policies on the same workload, with our real index and policy code.

N simulated workers, each a ``SimCache`` (our ``RadixTree`` with LRU eviction under a KV capacity in tokens, speaking the KV event
protocol) and a continuous-batching engine reduced to its timing under the same cost
model the timed workers wait by (``radix.cost_model``, a named profile): prefill one
request at a time in arrival order, in chunks of ``max_batched_tokens`` uncached
tokens, each chunk's step also carrying a decode step of the running requests; at
most ``max_num_seqs`` requests decoding; a request's first token at the end of its
prefill, its other tokens one decode step each, the step's cost fixed when its decode
starts (the batch then, each running request's context counted as its prompt plus
half its output). The router side is the real ``RouterIndex`` and the real policies,
seeing load as a real router does: each worker's load polled every ``poll_interval_s``
plus the router's own in-flight counts, updated at decision time; our policies read an
exact index fed by the workers' KV events, the peers' rule (``bench.peer_rule``) an
approximate one of what it routed (the peers get no KV events), shared by all tenants.

The workload streams from ``bench.workloads`` in arrival order, so memory holds only
the requests in flight. Output per policy: cached fraction (tokens the workers served
from cache / prompt tokens), TTFT p50/p99, throughput, max/mean requests per worker,
and the cached fraction over time.

Run: ``python -m bench sim [--workers 8 32] [--workloads rag chat] [--requests N]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from bench.peer_rule import DEFAULT_THRESHOLDS, TUNED_THRESHOLDS, ThresholdPolicy
from bench.sim_cache import SimCache
from bench.workloads import TraceRequest, WorkloadConfig, generate
from radix.cost_model import PROFILES, CostModel
from radix.events import KVEvent
from radix.keys import TOKEN_BYTES
from radix.tree import PUBLIC, RadixTree, Scope
from router.config import IndexConfig
from router.routing.index import RouterIndex, WorkerId
from router.routing.policy import (
    POLICIES,
    Policy,
    RandomPolicy,
    RouteRequest,
    WorkerView,
    make_policy,
)

NAMESPACE = "5a" * 32
# WorkerView from a tuple of all its fields, in C (its generated ``__new__`` and
# ``_make`` are Python calls: a third of a 256-worker run's time).
_view = functools.partial(tuple.__new__, WorkerView)
NO_ADAPTER = (0.0, 0.0)  # adapter_load_ms, adapter_swap_share: the simulated requests run no LoRA adapter
NUM_TIME_BUCKETS = 20
CLOSED = "closed"
# Session starts per second per worker: each workload at a load where queueing shows.
RATES = {"rag": 3.0, "chat": 2.0, "agent": 0.4, "rag_chat": 2.5, "multitenant": 4.0}


@dataclass(frozen=True)
class SimConfig:
    """A worker's step costs (``cost``: a profile's, ``llama3-8b-h100`` by default),
    KV capacity and batching limits, and the router's poll interval."""

    kv_capacity_tokens: int = 200_000
    cost: CostModel = PROFILES["llama3-8b-h100"].cost
    max_batched_tokens: int = 2048
    max_num_seqs: int = 64
    poll_interval_s: float = 1.0
    block_size: int = 16


@dataclass
class Job:
    """One request in the simulator: the trace request and what happened to it."""

    request: TraceRequest
    worker: int = 0
    num_counted_tokens: int = 0
    num_cached_tokens: int = 0
    first_token_s: float = 0.0

    @property
    def num_counted_context_tokens(self) -> float:
        """The context the counted (last) tokens of the prompt attend over, summed."""
        n = self.num_counted_tokens
        return n * (self.request.num_prompt_tokens - 0.5 * n)


# A policy for the simulator: its router-side index mode and a fresh policy object.
@dataclass(frozen=True)
class PolicySpec:
    """A policy as the simulator runs it: ``make`` builds it (seeded), ``exact`` says
    whether its router reads KV events (ours) or only what it routed (the peers)."""

    make: Callable[[int], Policy]
    exact: bool = True


def _ours(name: str, weights: dict[str, float] | None = None) -> PolicySpec:
    if name == RandomPolicy.name:
        return PolicySpec(lambda seed: RandomPolicy(seed=seed))
    return PolicySpec(lambda seed: make_policy(name, weights))


SIM_POLICIES: dict[str, PolicySpec] = {
    **{name: _ours(name) for name in POLICIES},
    "threshold_default": PolicySpec(lambda seed: ThresholdPolicy(**DEFAULT_THRESHOLDS), exact=False),
    "threshold_tuned": PolicySpec(lambda seed: ThresholdPolicy(**TUNED_THRESHOLDS), exact=False),
}


class PlainCache:
    """``SimCache`` without the KV event protocol, for routers that read none: the same
    ``RadixTree`` and LRU eviction under the same capacity; ``insert`` returns no
    events (hashing every block for events nobody reads dominates a large run)."""

    def __init__(self, capacity_tokens: int):
        self.capacity_tokens = capacity_tokens
        self.tree: RadixTree[None] = RadixTree()

    def match(self, key: bytes, scope: str) -> int:
        """Cached tokens of ``key`` visible to ``scope`` (counts as a use)."""
        return self.tree.match(key, Scope(scope)).num_matched_tokens

    def insert(self, key: bytes, scope: str, num_public_tokens: int = 0) -> list[KVEvent]:
        """Cache ``key`` (its first ``num_public_tokens`` as PUBLIC) and evict LRU leaves
        down to the capacity."""
        if num_public_tokens:
            self.tree.insert(key[: num_public_tokens * TOKEN_BYTES], PUBLIC)
        self.tree.insert(key, Scope(scope))
        excess = self.tree.num_tokens() - self.capacity_tokens
        if excess > 0:
            self.tree.evict(excess)
        return []


class SimWorker:
    """One worker's engine timing and cache (see the module docstring)."""

    def __init__(self, index: int, cluster: Cluster):
        self.index = index
        self.worker_id = WorkerId(f"w{index}")
        self.cluster = cluster
        config = cluster.config
        self.config = config
        self.cache: SimCache | PlainCache = (
            SimCache(self.worker_id, NAMESPACE, config.kv_capacity_tokens, config.block_size)
            if cluster.exact else PlainCache(config.kv_capacity_tokens))
        self.queue: deque[Job] = deque()
        self.num_waiting_tokens = 0
        self.prefilling = False
        self.num_decoding = 0
        self.num_decode_context_tokens = 0
        self.num_requests = 0
        self.busy_s = 0.0

    def load(self) -> tuple[int, int, int, float, None]:
        """What ``/info`` reports, in ``WorkerView``'s order: running requests, waiting
        requests, prompt tokens waiting (whole prompts, cached prefix included, as the
        engine counts them: it matches a prefix only at admission), KV usage, and no
        queue bound."""
        running = self.num_decoding + self.prefilling
        return (running, len(self.queue), self.num_waiting_tokens,
                self.cache.tree.num_tokens() / self.config.kv_capacity_tokens, None)

    def admit(self, job: Job) -> None:
        """Take ``job`` now: queue it (its prefix is matched when its prefill starts)."""
        request = job.request
        self.num_waiting_tokens += request.num_prompt_tokens
        self.num_requests += 1
        self.queue.append(job)
        self._start_prefill()

    def _start_prefill(self) -> None:
        if self.prefilling or not self.queue or self.num_decoding >= self.config.max_num_seqs:
            return
        job = self.queue.popleft()
        request = job.request
        # An engine matches a prefix when it schedules the request, not when it arrives:
        # a request that waited behind the prefill of its own prefix finds it cached.
        cached = self.cache.match(request.prompt, request.tenant)
        job.num_cached_tokens = min(cached, request.num_prompt_tokens - 1)
        self.num_waiting_tokens -= request.num_prompt_tokens
        self.prefilling = True
        prefill_s = self._prefill_s(job.num_cached_tokens, request.num_prompt_tokens)
        self.busy_s += prefill_s
        self.cluster.at(self.cluster.now + prefill_s, lambda: self._prefilled(job))

    def _prefill_s(self, num_cached: int, num_prompt: int) -> float:
        """The steps computing prompt tokens ``num_cached..num_prompt``: chunks of
        ``max_batched_tokens``, each step with the running decodes beside it (a chunk
        of one token is one more decode, as ``CostModel.step_s`` counts it)."""
        cost, total_s, done = self.config.cost, 0.0, num_cached
        batch, context = self.num_decoding, self.num_decode_context_tokens
        while done < num_prompt:
            n = min(self.config.max_batched_tokens, num_prompt - done)
            done += n
            total_s += (cost.decode_step_s(batch + 1, context + done) if n == 1 else
                        cost.prefill_chunk_s(n, done) + cost.decode_step_s(batch, context))
        return total_s

    def _prefilled(self, job: Job) -> None:
        request = job.request
        self.prefilling = False
        self.cluster.deliver(self, self.cache.insert(request.prompt, request.tenant, request.num_public_tokens))
        self.cluster.first_token(job)
        context = request.num_prompt_tokens + request.num_output_tokens // 2
        self.num_decoding += 1
        self.num_decode_context_tokens += context
        step_s = self.config.cost.decode_step_s(self.num_decoding, self.num_decode_context_tokens)
        decode_s = (request.num_output_tokens - 1) * step_s
        self.cluster.at(self.cluster.now + decode_s, lambda: self._finish(job, context))
        self._start_prefill()

    def _finish(self, job: Job, context: int) -> None:
        request = job.request
        self.num_decoding -= 1
        self.num_decode_context_tokens -= context
        self.cluster.deliver(self, self.cache.insert(request.prompt + request.output, request.tenant,
                                                     request.num_public_tokens))
        self.cluster.finish(job)
        self._start_prefill()


@dataclass
class Results:
    """Per-request outcomes, appended as requests finish."""

    arrival_s: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    num_prompt_tokens: list[int] = field(default_factory=list)
    num_cached_tokens: list[int] = field(default_factory=list)
    num_output_tokens: list[int] = field(default_factory=list)
    end_s: float = 0.0


class Cluster:
    """Simulated workers behind a router running ``policy`` over ``RouterIndex``; an
    event loop over simulated seconds (ties run in scheduling order). With
    ``kv_events`` our policies read an exact index fed by the workers' KV events;
    without, and always for the peers' rule, the router's index is approximate: what
    it routed to each worker, kept up to ``approximate_capacity_tokens`` (LRU) with no
    TTL, as the peers keep it and as our router does for workers without events.
    ``worker_class``: ``SimWorker``, or ``bench.sim_stepped.SteppedSimWorker`` to run
    the engine's step loop."""

    def __init__(self, spec: PolicySpec, num_workers: int, config: SimConfig, seed: int = 0,
                 kv_events: bool = True, approximate_capacity_tokens: int = 2**24,
                 worker_class: type[SimWorker] = SimWorker):
        self.now = 0.0
        self.config = config
        self.policy = spec.make(seed)
        self.exact = spec.exact and kv_events
        self.shared_tree = not spec.exact
        self.index = RouterIndex(IndexConfig(approximate_ttl_s=1e12), clock=lambda: self.now)
        self.workers = [worker_class(i, self) for i in range(num_workers)]
        if not self.exact:
            for w in self.workers:
                self.index.set_approximate(w.worker_id, approximate_capacity_tokens)
        # per worker: requests, uncached prompt tokens before their first token, the
        # context those attend over, and their whole prompts (WorkerState's counts)
        self.in_flight = [[0, 0, 0.0, 0] for _ in self.workers]
        self.polled = [w.load() for w in self.workers]
        self.next_poll_s = 0.0
        self.results = Results()
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._on_finish: Callable[[], None] | None = None

    def at(self, when: float, action: Callable[[], None]) -> None:
        """Run ``action`` at simulated time ``when``."""
        heapq.heappush(self._heap, (when, next(self._order), action))

    def run(self, requests: Iterator[TraceRequest]) -> Results:
        """Feed ``requests`` (in arrival order) and run until every one has finished."""
        def arrive(request: TraceRequest) -> None:
            self.submit(request)
            following = next(requests, None)
            if following is not None:
                self.at(following.arrival_s, lambda: arrive(following))

        first = next(requests, None)
        if first is not None:
            self.at(first.arrival_s, lambda: arrive(first))
        return self._loop()

    def run_closed(self, requests: Iterator[TraceRequest], num_clients: int) -> Results:
        """Closed loop: ``num_clients`` clients take ``requests`` in order, each sending
        its next the moment its last finishes (arrival times ignored; TTFT counts from
        the send), as ``bench.e2e``'s closed-loop clients do."""
        def send_next() -> None:
            request = next(requests, None)
            if request is not None:
                self.submit(dataclasses.replace(request, arrival_s=self.now))

        self._on_finish = send_next
        for _ in range(num_clients):
            send_next()
        return self._loop()

    def _loop(self) -> Results:
        while self._heap:
            self.now, _, action = heapq.heappop(self._heap)
            action()
        self.results.end_s = self.now
        return self.results

    def _scope(self, request: TraceRequest) -> str:
        return PUBLIC if self.shared_tree else request.tenant

    def submit(self, request: TraceRequest) -> None:
        """Route ``request`` now: match, choose, note, count, forward."""
        if self.now >= self.next_poll_s:
            self.polled = [w.load() for w in self.workers]
            self.next_poll_s = self.now + self.config.poll_interval_s
        scope = self._scope(request)
        matched, routed, _ = self.index.match_routed(NAMESPACE, request.prompt, scope)
        get, get_routed = matched.get, routed.get
        views = [_view((w.worker_id, get(w.worker_id, 0), requests, tokens, context, running,
                        waiting, waiting_tokens - sent if waiting_tokens > sent else 0, usage,
                        bound, *NO_ADAPTER, get_routed(w.worker_id, 0)))
                 for w, (requests, tokens, context, sent), (running, waiting, waiting_tokens, usage, bound)
                 in zip(self.workers, self.in_flight, self.polled, strict=True)]
        decision = self.policy.choose(RouteRequest(NAMESPACE, request.prompt, request.num_prompt_tokens,
                                                   scope), views)
        self.index.note_routed(NAMESPACE, decision.chosen, request.prompt, scope)
        job = Job(request, int(decision.chosen[1:]),
                  request.num_prompt_tokens - decision.num_matched_tokens)
        counts = self.in_flight[job.worker]
        counts[0] += 1
        counts[1] += job.num_counted_tokens
        counts[2] += job.num_counted_context_tokens
        counts[3] += request.num_prompt_tokens
        self.workers[job.worker].admit(job)

    def first_token(self, job: Job) -> None:
        """The job's prefill ended: its uncached tokens leave the in-flight count."""
        job.first_token_s = self.now
        counts = self.in_flight[job.worker]
        counts[1] -= job.num_counted_tokens
        counts[2] -= job.num_counted_context_tokens
        counts[3] -= job.request.num_prompt_tokens

    def finish(self, job: Job) -> None:
        """The job ended: it leaves the in-flight count and is recorded."""
        self.in_flight[job.worker][0] -= 1
        r, request = self.results, job.request
        r.arrival_s.append(request.arrival_s)
        r.ttft_s.append(job.first_token_s - request.arrival_s)
        r.num_prompt_tokens.append(request.num_prompt_tokens)
        r.num_cached_tokens.append(job.num_cached_tokens)
        r.num_output_tokens.append(request.num_output_tokens)
        if self._on_finish is not None:
            self._on_finish()

    def deliver(self, worker: SimWorker, events: list[KVEvent]) -> None:
        """A worker's KV events reach the router (exact mode only)."""
        if self.exact:
            for event in events:
                self.index.apply_event(worker.worker_id, event)


def summarize(cluster: Cluster, wall_s: float) -> dict[str, object]:
    """The numbers of one run (module docstring), JSON-ready."""
    r = cluster.results
    ttft = np.array(r.ttft_s)
    prompt = np.array(r.num_prompt_tokens, dtype=np.float64)
    cached = np.array(r.num_cached_tokens, dtype=np.float64)
    per_worker = np.array([w.num_requests for w in cluster.workers], dtype=np.float64)
    buckets = np.minimum((np.array(r.arrival_s) / max(r.arrival_s[-1], 1e-9) * NUM_TIME_BUCKETS).astype(int),
                         NUM_TIME_BUCKETS - 1)
    over_time = [float(cached[buckets == b].sum() / max(prompt[buckets == b].sum(), 1.0))
                 for b in range(NUM_TIME_BUCKETS)]
    return {
        "num_requests": len(ttft),
        "cached_fraction": float(cached.sum() / prompt.sum()),
        "ttft_p50_s": float(np.percentile(ttft, 50)),
        "ttft_p99_s": float(np.percentile(ttft, 99)),
        "ttft_mean_s": float(ttft.mean()),
        "requests_per_s": len(ttft) / r.end_s,
        "tokens_per_s": float((prompt.sum() + sum(r.num_output_tokens)) / r.end_s),
        "max_over_mean_load": float(per_worker.max() / per_worker.mean()),
        "requests_per_worker": per_worker.astype(int).tolist(),
        "cached_fraction_over_time": over_time,
        "wall_s": wall_s,
    }


TABLE_HEADER = (f"{'workload':<12}{'w':>4} {'policy':<18}{'cached':>8}{'p50 ms':>8}{'p99 ms':>8}"
                f"{'req/s':>8}{'max/mean':>9}{'wall s':>8}")


def table_row(workload: str, num_workers: int, policy: str, r: dict) -> str:
    """One run's line under ``TABLE_HEADER``."""
    return (f"{workload:<12}{num_workers:>4} {policy:<18}{r['cached_fraction']:>8.3f}"
            f"{1e3 * r['ttft_p50_s']:>8.0f}{1e3 * r['ttft_p99_s']:>8.0f}"
            f"{r['requests_per_s']:>8.0f}{r['max_over_mean_load']:>9.2f}{r['wall_s']:>8.1f}")


def simulate(policy: str, num_workers: int, workload: str, num_requests: int,
             rate_per_worker: float, seed: int = 0, config: SimConfig | None = None,
             workload_config: WorkloadConfig | None = None, arrival: str = "poisson",
             kv_events: bool = True, weights: dict[str, float] | None = None,
             clients_per_worker: int = 4) -> dict[str, object]:
    """One run of ``policy`` (a ``SIM_POLICIES`` name; one of ours runs with ``weights``
    over its defaults when given) on ``num_workers`` workers: ``num_requests`` requests
    of ``workload``, sessions starting at ``rate_per_worker * num_workers`` per second,
    or with ``arrival`` "closed", ``clients_per_worker * num_workers`` closed-loop
    clients taking them in that order (``kv_events``: see ``Cluster``)."""
    config = config or SimConfig()
    spec = _ours(policy, weights) if weights and policy in POLICIES else SIM_POLICIES[policy]
    cluster = Cluster(spec, num_workers, config, seed, kv_events, config.kv_capacity_tokens)
    closed = arrival == CLOSED
    requests = generate(workload, num_requests, rate_per_worker * num_workers, seed,
                        "poisson" if closed else arrival, workload_config)
    start = time.perf_counter()
    if closed:
        cluster.run_closed(requests, clients_per_worker * num_workers)
    else:
        cluster.run(requests)
    return summarize(cluster, time.perf_counter() - start)


def main(argv: list[str] | None = None) -> dict:
    """Every selected policy on every workload and worker count; prints a table and
    returns the numbers by ``workload/workers/policy``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--workloads", nargs="+", default=["rag", "chat", "agent", "multitenant"])
    parser.add_argument("--policies", nargs="+", default=list(SIM_POLICIES), choices=list(SIM_POLICIES))
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rate", type=float, default=None,
                        help="session starts per second per worker (default: per workload)")
    parser.add_argument("--arrival", default="poisson", choices=["poisson", "bursty", CLOSED],
                        help=f"{CLOSED}: --clients-per-worker clients in a closed loop")
    parser.add_argument("--clients-per-worker", type=int, default=4)
    parser.add_argument("--no-kv-events", action="store_true",
                        help="our policies read an approximate index (faster at scale)")
    parser.add_argument("--our-weights", nargs="*", default=[], metavar="NAME=VALUE",
                        help="our policies' weights over their defaults")
    args = parser.parse_args(argv)
    weights = {name: float(value) for name, value in (item.split("=") for item in args.our_weights)}
    results: dict[str, dict] = {}
    print(TABLE_HEADER)
    for num_workers in args.workers:
        for workload in args.workloads:
            for policy in args.policies:
                r = simulate(policy, num_workers, workload, args.requests,
                             args.rate or RATES[workload], arrival=args.arrival,
                             kv_events=not args.no_kv_events, weights=weights,
                             clients_per_worker=args.clients_per_worker)
                results[f"{workload}/{num_workers}/{policy}"] = r
                print(table_row(workload, num_workers, policy, r), flush=True)
    return results


if __name__ == "__main__":
    main()
