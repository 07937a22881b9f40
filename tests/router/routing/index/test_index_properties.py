"""RouterIndex against brute force, on event streams of simulated workers.

Each worker is a ``SimCache`` (a real RadixTree reporting its inserts and evictions as
KV events per docs/protocol.md). The oracle keeps, per worker, every stored and not
yet removed block as (full path, scope), rebuilt from the events alone; a worker's
answer for a query is the longest common prefix of the query with any of its blocks
visible to the query's scope. After every step the index must give exactly that, and
stay within a block of the worker's own tree: floor(real / B) * B <= index <= real.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from bench.sim_cache import SimCache
from radix.events import KVEvent
from radix.keys import from_key, to_key
from radix.tree import PUBLIC
from router.routing.index import RouterIndex
from tests.support.prefixes import common_prefix_length

NAMESPACE = "5e" * 32
BLOCK = 4
WORKERS = ["w0", "w1", "w2"]
TENANTS = ["tenant-a", "tenant-b"]
tokens = st.lists(st.integers(0, 2), min_size=1, max_size=22)


class BlockOracle:
    """Brute force: every live block of every worker as (full path, scope)."""

    def __init__(self) -> None:
        self.blocks: dict[str, dict[str, tuple[tuple[int, ...], str]]] = {w: {} for w in WORKERS}

    def apply(self, worker: str, event: KVEvent) -> None:
        blocks = self.blocks[worker]
        if event.type == "cleared":
            blocks.clear()
        for block in event.blocks:
            if event.type == "removed":
                blocks.pop(block.hash, None)
            elif block.hash not in blocks:
                prefix = blocks[block.parent][0] if block.parent else ()
                blocks[block.hash] = (prefix + (block.tokens or ()), event.scope)

    def match(self, query: list[int], scope: str) -> dict[str, int]:
        found = {}
        for worker, blocks in self.blocks.items():
            best = max((common_prefix_length(query, path) for path, s in blocks.values() if s in (scope, PUBLIC)), default=0)
            if best:
                found[worker] = best
        return found


class IndexMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.index = RouterIndex()
        self.oracle = BlockOracle()
        self.caches = {w: SimCache(w, NAMESPACE, 60, BLOCK) for w in WORKERS}
        self.queries: list[list[int]] = []

    def deliver(self, worker: str, events: list[KVEvent]) -> None:
        for event in events:
            self.index.apply_event(worker, event)
            self.oracle.apply(worker, event)

    @rule(worker=st.sampled_from(WORKERS), seq=tokens, scope=st.sampled_from(TENANTS),
          public_blocks=st.integers(0, 3))
    def insert(self, worker: str, seq: list[int], scope: str, public_blocks: int) -> None:
        num_public = min(public_blocks * BLOCK, len(seq) // BLOCK * BLOCK)
        self.deliver(worker, self.caches[worker].insert(to_key(seq), scope, num_public))
        self.queries.append(seq)

    @rule(worker=st.sampled_from(WORKERS), seq=tokens, scope=st.sampled_from([*TENANTS, PUBLIC]))
    def touch(self, worker: str, seq: list[int], scope: str) -> None:
        self.caches[worker].match(to_key(seq), scope)

    @rule(worker=st.sampled_from(WORKERS), num_tokens=st.integers(1, 30))
    def evict(self, worker: str, num_tokens: int) -> None:
        self.deliver(worker, self.caches[worker].evict(num_tokens))

    @rule(worker=st.sampled_from(WORKERS))
    def restart(self, worker: str) -> None:
        self.deliver(worker, [self.caches[worker].clear()])

    @rule(query=tokens, scope=st.sampled_from([*TENANTS, PUBLIC, "tenant-c"]))
    def random_query(self, query: list[int], scope: str) -> None:
        self.check_query(query, scope)

    def check_query(self, query: list[int], scope: str) -> None:
        key = to_key(query)
        got = self.index.match(NAMESPACE, key, scope)
        assert got == self.oracle.match(query, scope), (query, scope)
        for worker, cache in self.caches.items():
            real = cache.tree.match(key, scope, touch=False).num_matched_tokens
            assert real // BLOCK * BLOCK <= got.get(worker, 0) <= real, (worker, query, scope)

    @invariant()
    def index_matches_brute_force(self) -> None:
        self.index.check_invariants()
        leaves = [
            from_key(cache.tree.path_key(node))
            for cache in self.caches.values()
            for node in cache.tree.iter_nodes()
            if node.is_leaf()
        ]
        for query in self.queries[-4:] + leaves:
            for scope in (*TENANTS, PUBLIC):
                self.check_query(query + [9], scope)
                self.check_query(query[: len(query) // 2 + 1], scope)

    @invariant()
    def unknown_tenant_sees_public_only(self) -> None:
        for query in self.queries[-4:]:
            key = to_key(query)
            assert self.index.match(NAMESPACE, key, "tenant-c") == self.index.match(NAMESPACE, key, PUBLIC)


IndexMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_index_matches_brute_force = IndexMachine.TestCase
