"""Routing quality: how much prompt work each policy saves, and how evenly it loads workers.

A cluster simulator drives the real ``RouterIndex`` and policies. Each simulated
worker (``SimWorker``) holds a ``SimCache``: a real ``RadixTree`` with LRU eviction
under a token capacity whose inserts and evictions reach ``RouterIndex.apply_event``
as the KV events of docs/protocol.md. Requests prefill one at a time per worker, in
arrival order, at a cost per uncached token, then decode side by side; so a policy
that piles requests onto one worker pays in queueing (time to first token), and one
that ignores the cache pays in prefill. The router sees load as a real one does:
polled every second plus its own in-flight counts, updated at decision time.
``time_index`` times the index alone at a larger size.

Run: ``python -m bench.routing_quality [--requests N]``.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bench.sim_cache import SimCache
from radix.events import KVEvent
from radix.keys import TOKEN_BYTES
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
BLOCK_SIZE = 16
PREFILL_S_PER_TOKEN = 50e-6
DECODE_INTERFERENCE = 0.005
DECODE_STEP_S = 0.010
DECODE_STEP_S_PER_RUNNING = 0.0002
POLL_INTERVAL_S = 1.0
REQUESTS_PER_S_PER_WORKER = 9.0
CAPACITY_TOKENS = 150_000
TENANTS = [f"tenant-{i}" for i in range(8)]


@dataclass
class SimRequest:
    """One request; ``turns_left`` > 0 for a conversation turn with more to come."""

    key: bytes
    scope: str
    num_public_tokens: int
    output: bytes
    arrival_s: float
    turns_left: int = 0
    worker: WorkerId = WorkerId("")
    num_uncached_at_decision: int = 0
    num_cached_tokens: int = 0
    ttft_s: float = 0.0

    @property
    def num_prompt_tokens(self) -> int:
        """Prompt length in tokens."""
        return len(self.key) // TOKEN_BYTES


@dataclass(frozen=True)
class WorkloadShape:
    """Sizes of a ``Workload``: counts, and [low, high) token ranges drawn uniformly.
    The defaults are the simulation's; ``vocab_size`` bounds the random token ids."""

    num_docs: int = 120
    doc_tokens: tuple[int, int] = (1000, 4000)
    question_tokens: tuple[int, int] = (50, 200)
    answer_tokens: tuple[int, int] = (32, 128)
    num_system_prompts: int = 4
    system_tokens: tuple[int, int] = (300, 301)
    first_message_tokens: tuple[int, int] = (100, 400)
    turn_tokens: tuple[int, int] = (50, 200)
    num_turns: tuple[int, int] = (2, 8)
    zipf_exponent: float = 1.1
    vocab_size: int = 32_000


class Workload:
    """RAG documents (1,000-4,000 tokens, Zipf(1.1) popularity, registered public), each
    request a document plus a private 50-200 token question; and conversations on one
    of four public system prompts, each turn resending the history plus a new message
    3 s (mean) after the previous answer. ``shape`` changes these sizes."""

    def __init__(self, rng: np.random.Generator, shape: WorkloadShape = WorkloadShape()):
        self.rng = rng
        self.shape = shape
        self.docs = [self._tokens(shape.doc_tokens) for _ in range(shape.num_docs)]
        popularity = np.arange(1, len(self.docs) + 1, dtype=np.float64) ** -shape.zipf_exponent
        self.popularity = popularity / popularity.sum()
        self.system_prompts = [self._tokens(shape.system_tokens) for _ in range(shape.num_system_prompts)]

    def _tokens(self, bounds: tuple[int, int]) -> bytes:
        length = int(self.rng.integers(*bounds))
        return self.rng.integers(0, self.shape.vocab_size, length, dtype=np.uint32).tobytes()

    def _tenant(self) -> str:
        return TENANTS[int(self.rng.integers(len(TENANTS)))]

    def document_request(self, now: float) -> SimRequest:
        """A question about a document drawn by popularity, arriving at ``now``."""
        doc = self.docs[self.rng.choice(len(self.docs), p=self.popularity)]
        num_public = len(doc) // TOKEN_BYTES // BLOCK_SIZE * BLOCK_SIZE
        return SimRequest(doc + self._tokens(self.shape.question_tokens), self._tenant(), num_public,
                          self._tokens(self.shape.answer_tokens), now)

    def first_turn(self, now: float) -> SimRequest:
        """The opening turn of a new conversation, arriving at ``now``."""
        system = self.system_prompts[int(self.rng.integers(len(self.system_prompts)))]
        num_public = len(system) // TOKEN_BYTES // BLOCK_SIZE * BLOCK_SIZE
        return SimRequest(system + self._tokens(self.shape.first_message_tokens), self._tenant(),
                          num_public, self._tokens(self.shape.turn_tokens), now,
                          turns_left=int(self.rng.integers(*self.shape.num_turns)))

    def next_turn(self, previous: SimRequest, now: float) -> tuple[float, SimRequest]:
        """When the turn after ``previous`` arrives, and the turn itself."""
        arrival = now + float(self.rng.exponential(3.0))
        history = previous.key + previous.output + self._tokens(self.shape.turn_tokens)
        return arrival, SimRequest(history, previous.scope, previous.num_public_tokens,
                                   self._tokens(self.shape.turn_tokens), arrival, previous.turns_left - 1)


class SimWorker:
    """A continuous-batching engine, simplified. A request is admitted on arrival (its
    cached prefix is matched then, as the engine's ``admit`` does), prefills one at a
    time in arrival order at ``PREFILL_S_PER_TOKEN`` per uncached token (slowed by
    ``DECODE_INTERFERENCE`` per running decode), is inserted into the cache, then
    decodes alongside the others at ``DECODE_STEP_S`` (+ ``DECODE_STEP_S_PER_RUNNING``
    per running decode) per output token and is inserted again with its output."""

    def __init__(self, worker_id: WorkerId, cluster: Cluster):
        self.worker_id = worker_id
        self.cluster = cluster
        self.cache = SimCache(worker_id, NAMESPACE, CAPACITY_TOKENS, BLOCK_SIZE)
        self.queue: deque[SimRequest] = deque()
        self.prefilling = False
        self.num_decoding = 0
        self.busy_s = 0.0

    def load(self) -> tuple[int, int, float]:
        """What ``/info`` would report: running requests, prompt tokens queued for
        prefill, KV cache usage."""
        waiting = sum(r.num_prompt_tokens - r.num_cached_tokens for r in self.queue)
        running = self.num_decoding + self.prefilling
        return running, waiting, self.cache.tree.num_tokens() / CAPACITY_TOKENS

    def admit(self, request: SimRequest) -> None:
        """Take ``request`` now: match its prefix and queue it for prefill."""
        cached = self.cache.match(request.key, request.scope)
        request.num_cached_tokens = min(cached, request.num_prompt_tokens - 1)
        self.queue.append(request)
        if not self.prefilling:
            self._prefill_next()

    def _prefill_next(self) -> None:
        self.prefilling = bool(self.queue)
        if not self.queue:
            return
        request = self.queue.popleft()
        uncached = request.num_prompt_tokens - request.num_cached_tokens
        prefill_s = uncached * PREFILL_S_PER_TOKEN * (1 + DECODE_INTERFERENCE * self.num_decoding)
        self.busy_s += prefill_s
        self.cluster.at(self.cluster.now + prefill_s, lambda: self._prefilled(request))

    def _prefilled(self, request: SimRequest) -> None:
        now = self.cluster.now
        request.ttft_s = now - request.arrival_s
        self.cluster.deliver(self.worker_id, self.cache.insert(request.key, request.scope, request.num_public_tokens))
        self.cluster.first_token(request)
        decode_s = len(request.output) // TOKEN_BYTES * (DECODE_STEP_S + DECODE_STEP_S_PER_RUNNING * self.num_decoding)
        self.num_decoding += 1
        self.cluster.at(now + decode_s, lambda: self._finish(request))
        self._prefill_next()

    def _finish(self, request: SimRequest) -> None:
        self.num_decoding -= 1
        events = self.cache.insert(request.key + request.output, request.scope, request.num_public_tokens)
        self.cluster.deliver(self.worker_id, events)
        self.cluster.finish(request)


class Cluster:
    """Simulated workers behind a router with the real ``RouterIndex`` and a policy; an
    event loop over simulated seconds. The router polls load every ``POLL_INTERVAL_S``
    and counts its in-flight requests and their uncached prompt tokens (until the first
    token; whole prompts until the end with ``count_full_prompt``) at decision time."""

    def __init__(self, policy: Policy, num_workers: int, workload: Workload, count_full_prompt: bool):
        self.now = 0.0
        self.policy = policy
        self.workload = workload
        self.count_full_prompt = count_full_prompt
        self.index = RouterIndex(clock=lambda: self.now)
        self.workers = [SimWorker(WorkerId(f"w{i}"), self) for i in range(num_workers)]
        self.in_flight = {w.worker_id: [0, 0] for w in self.workers}
        self.polled = {w.worker_id: (0, 0, 0.0) for w in self.workers}
        self.next_poll_s = 0.0
        self.done: list[SimRequest] = []
        self.timing = {"apply_s": 0.0, "num_apply": 0, "num_blocks": 0, "match_s": 0.0, "num_match": 0}
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def at(self, when: float, action: Callable[[], None]) -> None:
        """Run ``action`` at simulated time ``when`` (ties in scheduling order)."""
        heapq.heappush(self._heap, (when, next(self._order), action))

    def run(self) -> None:
        """Run every scheduled action in time order until none is left."""
        while self._heap:
            self.now, _, action = heapq.heappop(self._heap)
            action()

    def submit(self, request: SimRequest) -> None:
        """Route ``request`` now: match, choose, note, count, forward."""
        if self.now >= self.next_poll_s:
            self.polled = {w.worker_id: w.load() for w in self.workers}
            self.next_poll_s = self.now + POLL_INTERVAL_S
        start = time.perf_counter()
        matched = self.index.match(NAMESPACE, request.key, request.scope)
        self.timing["match_s"] += time.perf_counter() - start
        self.timing["num_match"] += 1
        views = [WorkerView(w.worker_id, matched.get(w.worker_id, 0), *self.in_flight[w.worker_id],
                            *self.polled[w.worker_id]) for w in self.workers]
        route = RouteRequest(NAMESPACE, request.key, request.num_prompt_tokens, request.scope)
        decision = self.policy.choose(route, views)
        self.index.note_routed(NAMESPACE, decision.chosen, request.key, request.scope)
        request.worker = decision.chosen
        request.num_uncached_at_decision = request.num_prompt_tokens - decision.num_matched_tokens
        self.in_flight[request.worker][0] += 1
        self.in_flight[request.worker][1] += self._counted_tokens(request)
        next(w for w in self.workers if w.worker_id == decision.chosen).admit(request)

    def _counted_tokens(self, request: SimRequest) -> int:
        if self.count_full_prompt:
            return request.num_prompt_tokens
        return request.num_uncached_at_decision

    def first_token(self, request: SimRequest) -> None:
        """``request`` finished its prefill: its prompt tokens leave the in-flight count."""
        if not self.count_full_prompt:
            self.in_flight[request.worker][1] -= self._counted_tokens(request)

    def finish(self, request: SimRequest) -> None:
        """``request`` ended: count it done and schedule its conversation's next turn."""
        self.in_flight[request.worker][0] -= 1
        if self.count_full_prompt:
            self.in_flight[request.worker][1] -= self._counted_tokens(request)
        self.done.append(request)
        if request.turns_left:
            arrival, turn = self.workload.next_turn(request, self.now)
            self.at(arrival, lambda: self.submit(turn))

    def deliver(self, worker_id: WorkerId, events: list[KVEvent]) -> None:
        """Apply a worker's KV events to the router index, timing each."""
        for event in events:
            start = time.perf_counter()
            self.index.apply_event(worker_id, event)
            self.timing["apply_s"] += time.perf_counter() - start
            self.timing["num_apply"] += 1
            self.timing["num_blocks"] += len(event.blocks)


def simulate(policy_name: str, num_workers: int, num_requests: int, count_full_prompt: bool = False,
             seed: int = 0) -> dict[str, float]:
    """One run: ``num_requests`` first arrivals (70% documents, 30% new conversations
    whose later turns follow), Poisson at the per-worker rate. ``count_full_prompt``
    makes the router count whole prompts in flight until the request ends, instead of
    uncached tokens until the first token."""
    rng = np.random.default_rng(seed)
    workload = Workload(rng)
    policy = RandomPolicy(seed=seed) if policy_name == RandomPolicy.name else make_policy(policy_name)
    cluster = Cluster(policy, num_workers, workload, count_full_prompt)
    rate = REQUESTS_PER_S_PER_WORKER * num_workers
    arrival = 0.0
    for _ in range(num_requests):
        arrival += float(rng.exponential(1.0 / rate))
        request = workload.document_request(arrival) if rng.random() < 0.7 else workload.first_turn(arrival)
        cluster.at(arrival, lambda r=request: cluster.submit(r))
    cluster.run()
    done, timing, stats = cluster.done, cluster.timing, cluster.index.stats()
    ttft = np.array([r.ttft_s for r in done])
    busy = np.array([w.busy_s for w in cluster.workers])
    return {
        "num_requests": len(done),
        "cached_fraction": sum(r.num_cached_tokens for r in done) / sum(r.num_prompt_tokens for r in done),
        "max_over_mean_load": float(busy.max() / busy.mean()),
        "mean_ttft_s": float(ttft.mean()),
        "p99_ttft_s": float(np.percentile(ttft, 99)),
        "apply_event_us": 1e6 * timing["apply_s"] / timing["num_apply"],
        "blocks_per_event": timing["num_blocks"] / timing["num_apply"],
        "match_us": 1e6 * timing["match_s"] / timing["num_match"],
        "index_nodes": stats.num_nodes,
        "index_tokens": stats.num_tokens,
    }


def time_index(num_workers: int = 8, capacity_tokens: int = 1_000_000, num_requests: int = 6000) -> dict[str, float]:
    """The index at a larger size: ``num_workers`` caches of ``capacity_tokens`` filled
    by the workload (each request on a random worker, conversation turns back to back),
    timing every ``apply_event``, then 2,000 ``match`` and ``note_routed`` calls."""
    rng = np.random.default_rng(1)
    workload = Workload(rng)
    index = RouterIndex()
    caches = [SimCache(f"w{i}", NAMESPACE, capacity_tokens, BLOCK_SIZE) for i in range(num_workers)]
    apply_s, num_events, num_blocks = 0.0, 0, 0
    request = None
    for _ in range(num_requests):
        if request is not None and request.turns_left:
            request = workload.next_turn(request, 0.0)[1]
        else:
            request = workload.document_request(0.0) if rng.random() < 0.7 else workload.first_turn(0.0)
        worker = int(rng.integers(num_workers))
        for event in caches[worker].insert(request.key + request.output, request.scope, request.num_public_tokens):
            start = time.perf_counter()
            index.apply_event(WorkerId(f"w{worker}"), event)
            apply_s += time.perf_counter() - start
            num_events, num_blocks = num_events + 1, num_blocks + len(event.blocks)
    queries = [workload.document_request(0.0) if i % 2 else workload.first_turn(0.0) for i in range(2000)]
    start = time.perf_counter()
    for q in queries:
        index.match(NAMESPACE, q.key, q.scope)
    match_s = time.perf_counter() - start
    start = time.perf_counter()
    for i, q in enumerate(queries):
        index.note_routed(NAMESPACE, WorkerId(f"w{i % num_workers}"), q.key, q.scope)
    note_s = time.perf_counter() - start
    stats = index.stats()
    return {
        "num_workers": num_workers,
        "worker_tokens": sum(c.tree.num_tokens() for c in caches),
        "index_nodes": stats.num_nodes,
        "index_tokens": stats.num_tokens,
        "apply_event_us": 1e6 * apply_s / num_events,
        "apply_block_us": 1e6 * apply_s / num_blocks,
        "match_us": 1e6 * match_s / len(queries),
        "mean_query_tokens": float(np.mean([q.num_prompt_tokens for q in queries])),
        "note_routed_us": 1e6 * note_s / len(queries),
    }


def _row(label: str, num_workers: int, r: dict[str, float]) -> str:
    return (f"{label:<22}{num_workers:>3}{r['num_requests']:>7}{r['cached_fraction']:>8.1%}"
            f"{r['max_over_mean_load']:>9.2f}{1e3 * r['mean_ttft_s']:>8.0f}{1e3 * r['p99_ttft_s']:>8.0f}"
            f"{r['apply_event_us']:>9.0f}{r['blocks_per_event']:>7.1f}{r['match_us']:>9.0f}"
            f"{r['index_nodes']:>7}{r['index_tokens'] / 1e3:>7.0f}k")


def main(argv: list[str] | None = None) -> dict:
    """Every policy on 2 and 4 workers (plus cache_aware with whole prompts counted in
    flight); prints a table and returns the numbers by ``policy/workers``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1500, help="first arrivals per run")
    args = parser.parse_args(argv)
    results: dict[str, dict[str, float]] = {}
    print(f"{'policy':<22}{'w':>3}{'reqs':>7}{'cached':>8}{'max/mean':>9}{'ttft ms':>8}{'p99 ms':>8}"
          f"{'apply us':>9}{'blocks':>7}{'match us':>9}{'nodes':>7}{'tokens':>8}")
    for num_workers in (2, 4):
        for name in POLICIES:
            r = results[f"{name}/{num_workers}"] = simulate(name, num_workers, args.requests)
            print(_row(name, num_workers, r), flush=True)
        r = results[f"cache_aware+full_prompt/{num_workers}"] = simulate(
            "cache_aware", num_workers, args.requests, count_full_prompt=True)
        print(_row("cache_aware+full_prompt", num_workers, r), flush=True)
    t = results["index_timing"] = time_index()
    print(f"\nindex, {t['num_workers']} workers holding {t['worker_tokens'] / 1e6:.1f}M tokens: "
          f"{t['index_nodes']} nodes, {t['index_tokens'] / 1e6:.1f}M tokens; apply_event "
          f"{t['apply_event_us']:.0f} us ({t['apply_block_us']:.1f} us/block); match "
          f"{t['match_us']:.0f} us ({t['mean_query_tokens']:.0f}-token prompts); "
          f"note_routed {t['note_routed_us']:.0f} us")
    return results


if __name__ == "__main__":
    main()
