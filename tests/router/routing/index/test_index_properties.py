"""RouterIndex against brute force, on event streams of simulated workers.

Three workers (``SimCache``: real radix trees that describe every insert, eviction
and restart as KV events per docs/protocol.md) cache random sequences under two
tenants with public prefixes. Their events reach the index in order, or out of order
(a pending event delivered early), or twice. After every step, for queries through
every cached path, the index equals the brute force of its rule (``BlockModel``: the
longest chain of whole blocks each worker holds visibly to the query's scope), and,
while every event arrived, in order, stays within a block of each worker's own tree:
floor(real / B) * B <= index <= real.
"""

from __future__ import annotations

import random

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from bench.sim_cache import SimCache
from radix.events import KVEvent
from radix.keys import from_key, to_key
from radix.tree import PUBLIC
from router.routing.index import RouterIndex
from tests.support.block_model import BlockModel

NAMESPACE = "5e" * 32
BLOCK = 4
WORKERS = ["w0", "w1", "w2"]
TENANTS = ["tenant-a", "tenant-b"]
tokens = st.lists(st.integers(0, 2), min_size=1, max_size=22)


class IndexMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.index = RouterIndex()
        self.model = BlockModel()
        self.caches = {w: SimCache(w, NAMESPACE, 60, BLOCK) for w in WORKERS}
        self.pending: dict[str, list[KVEvent]] = {w: [] for w in WORKERS}
        self.delivered: dict[str, list[KVEvent]] = {w: [] for w in WORKERS}
        self.in_order = True
        self.queries: list[list[int]] = []

    def deliver(self, worker: str, event: KVEvent) -> None:
        self.index.apply_event(worker, event)
        self.model.apply(worker, event)
        self.delivered[worker].append(event)

    def flush(self, worker: str) -> None:
        while self.pending[worker]:
            self.deliver(worker, self.pending[worker].pop(0))

    @rule(worker=st.sampled_from(WORKERS), seq=tokens, scope=st.sampled_from(TENANTS),
          public_blocks=st.integers(0, 3), held_back=st.booleans())
    def insert(self, worker: str, seq: list[int], scope: str, public_blocks: int,
               held_back: bool) -> None:
        num_public = min(public_blocks * BLOCK, len(seq) // BLOCK * BLOCK)
        self.pending[worker] += self.caches[worker].insert(to_key(seq), scope, num_public)
        self.queries.append(seq)
        if not held_back:
            self.flush(worker)

    @rule(worker=st.sampled_from(WORKERS), num_tokens=st.integers(1, 30))
    def evict(self, worker: str, num_tokens: int) -> None:
        self.pending[worker] += self.caches[worker].evict(num_tokens)
        self.flush(worker)

    @rule(worker=st.sampled_from(WORKERS))
    def restart(self, worker: str) -> None:
        self.flush(worker)
        self.deliver(worker, self.caches[worker].clear())

    @rule(worker=st.sampled_from(WORKERS), seed=st.integers(0, 2**16))
    def deliver_one_early(self, worker: str, seed: int) -> None:
        pending = self.pending[worker]
        if len(pending) > 1:
            self.in_order = False
            self.deliver(worker, pending.pop(random.Random(seed).randrange(1, len(pending))))

    @rule(worker=st.sampled_from(WORKERS), seed=st.integers(0, 2**16))
    def deliver_one_twice(self, worker: str, seed: int) -> None:
        done = [e for e in self.delivered[worker] if e.type != "cleared"]
        if done:
            self.in_order = False
            self.deliver(worker, done[random.Random(seed).randrange(len(done))])

    @rule(query=tokens, scope=st.sampled_from([*TENANTS, PUBLIC, "tenant-c"]))
    def random_query(self, query: list[int], scope: str) -> None:
        self.check_query(query, scope)

    def check_query(self, query: list[int], scope: str) -> None:
        key = to_key(query)
        got = self.index.match(NAMESPACE, key, scope)
        assert got == self.model.match(query, scope), (query, scope)
        if self.in_order and not any(self.pending.values()):
            for worker, cache in self.caches.items():
                real = cache.tree.match(key, scope, touch=False).num_matched_tokens
                assert real // BLOCK * BLOCK <= got.get(worker, 0) <= real, (worker, query, scope)

    @invariant()
    def index_matches_brute_force(self) -> None:
        self.index.check_invariants()
        leaves = [from_key(cache.tree.path_key(node)) for cache in self.caches.values()
                  for node in cache.tree.iter_nodes() if node.is_leaf()]
        for query in self.queries[-4:] + leaves:
            for scope in (*TENANTS, PUBLIC):
                self.check_query(query + [9], scope)
                self.check_query(query[: len(query) // 2 + 1], scope)


    @invariant()
    def unknown_tenant_sees_public_only(self) -> None:
        for query in self.queries[-4:]:
            key = to_key(query)
            assert (self.index.match(NAMESPACE, key, "tenant-c")
                    == self.index.match(NAMESPACE, key, PUBLIC))


IndexMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                          deadline=None)
test_index_matches_brute_force = IndexMachine.TestCase
