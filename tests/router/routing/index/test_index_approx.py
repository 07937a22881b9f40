"""The approximate part of RouterIndex (one tree per scope shared by all workers):
exact outcomes of splits, TTLs, capacity eviction and resets, then a property test
against a brute-force model of what was routed to whom and when, and which of it the
worker confirmed it computed."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from radix.keys import to_key
from radix.tree import PUBLIC
from router.config import IndexConfig
from router.routing.index import RouterIndex
from tests.support.prefixes import common_prefix_length

NS = "ab" * 32
CONFIG = IndexConfig(speculative_ttl_s=2.0, approximate_ttl_s=5.0)


class Clock:
    """A settable clock."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_index(**approximate: int) -> tuple[RouterIndex, Clock]:
    """An index on a settable clock; ``approximate`` names approximate workers and
    their capacities."""
    clock = Clock()
    index = RouterIndex(CONFIG, clock=clock)
    for worker_id, capacity in approximate.items():
        index.set_approximate(worker_id, capacity_tokens=capacity)
    return index, clock


def note(index: RouterIndex, worker_id: str, tokens: list[int], scope: str = PUBLIC) -> None:
    index.note_routed(NS, worker_id, to_key(tokens), scope)
    index.check_invariants()


def match(index: RouterIndex, tokens: list[int], scope: str = PUBLIC) -> dict[str, int]:
    found = index.match(NS, to_key(tokens), scope)
    index.check_invariants()
    return found


def test_a_split_shared_edge_keeps_both_workers_stamps_and_lru_order():
    index, clock = make_index(a=6, b=100)
    note(index, "a", [1, 2, 3, 4, 5, 6])
    clock.now += 1
    note(index, "b", [1, 2, 3, 9])  # cuts a's edge after [1, 2, 3]
    assert match(index, [1, 2, 3, 4, 5, 6]) == {"a": 6, "b": 3}
    clock.now += 1
    note(index, "a", [7, 7])  # 8 tokens: a's oldest worker-leaf [4, 5, 6] goes, not its parent
    assert match(index, [1, 2, 3, 4, 5, 6]) == {"a": 3, "b": 3}
    assert index.stats().num_approx_tokens == {"a": 5, "b": 4}
    clock.now += 1
    note(index, "a", [8, 8, 8])  # then the head [1, 2, 3], stamped when the edge was whole
    assert match(index, [1, 2, 3, 9]) == {"b": 4}
    assert (match(index, [7, 7]), match(index, [8, 8, 8])) == ({"a": 2}, {"a": 3})
    assert index.stats().num_approx_tokens == {"a": 5, "b": 4}


def test_a_split_head_keeps_the_stamp_of_the_edge_it_came_from():
    index, clock = make_index()
    note(index, "a", [1, 2, 3, 4, 5, 6])
    clock.now += 1.5
    note(index, "b", [1, 2, 3, 9])
    clock.now += 0.5  # a's entries, head included, are 2.0 s old: expired
    assert match(index, [1, 2, 3, 4, 5, 6]) == {"b": 3}
    clock.now += 1.5
    assert match(index, [1, 2, 3, 9]) == {}
    assert index.stats().num_approx_tokens == {"a": 0, "b": 0}


def test_ttl_is_per_worker_class_on_shared_nodes():
    index, clock = make_index(oa=100)
    for worker_id in ("w", "oa"):
        note(index, worker_id, [1, 2, 3, 4])
    clock.now += 1.9
    assert match(index, [1, 2, 3, 4]) == {"w": 4, "oa": 4}
    clock.now += 0.1
    assert match(index, [1, 2, 3, 4]) == {"oa": 4}
    note(index, "w", [1, 2])
    clock.now += 1.9
    assert match(index, [1, 2, 3, 4]) == {"w": 2, "oa": 4}
    clock.now += 0.1
    assert match(index, [1, 2, 3, 4]) == {"oa": 4}
    clock.now += 1.0
    assert match(index, [1, 2, 3, 4]) == {}
    assert index.stats().num_approx_tokens == {"w": 0, "oa": 0}


def test_capacity_evicts_each_workers_least_recently_routed_tokens_first():
    index, clock = make_index(small=8, large=100)
    for tail in ([5, 5], [6, 6], [7, 7]):
        note(index, "large", [1, 2, 3, 4, *tail])
        note(index, "small", [1, 2, 3, 4, *tail])
        clock.now += 0.5
    # small held 10 tokens: its oldest leaf [5, 5] went; large keeps everything.
    assert match(index, [1, 2, 3, 4, 5, 5]) == {"large": 6, "small": 4}
    note(index, "small", [1, 2, 3, 4, 6, 6])
    clock.now += 0.5
    note(index, "small", [1, 2, 3, 4, 8, 8])  # [7, 7] is now small's oldest, not [6, 6]
    assert match(index, [1, 2, 3, 4, 7, 7]) == {"large": 6, "small": 4}
    assert match(index, [1, 2, 3, 4, 6, 6]) == {"large": 6, "small": 6}
    assert index.stats().num_approx_tokens == {"large": 10, "small": 8}


def test_a_key_longer_than_the_capacity_is_cut_to_it():
    index, _ = make_index(oa=4)
    note(index, "oa", [1, 2, 3, 4, 5, 6])
    assert match(index, [1, 2, 3, 4, 5, 6]) == {"oa": 4}
    assert index.stats().num_approx_tokens == {"oa": 4}


def test_reset_of_one_worker_leaves_the_others_entries():
    index, _ = make_index()
    note(index, "w1", [1, 2, 3, 4, 5])
    note(index, "w2", [1, 2, 3, 6])
    note(index, "w1", [1, 2, 3, 6, 7], "tenant-a")
    note(index, "w2", [1, 2, 3, 6, 7], "tenant-a")
    index.reset_worker("w1")
    index.check_invariants()
    assert match(index, [1, 2, 3, 4, 5]) == {"w2": 3}
    assert match(index, [1, 2, 3, 6, 7], "tenant-a") == {"w2": 5}
    assert index.stats().num_approx_tokens == {"w2": 9}


def test_what_was_routed_under_a_tenant_stays_that_tenants():
    index, clock = make_index()
    note(index, "w", [1, 2, 3])
    clock.now += 1
    note(index, "w", [1, 2, 3, 4], "tenant-a")
    assert match(index, [1, 2, 3, 4], "tenant-b") == {"w": 3}
    assert index.stats().num_approx_tokens == {"w": 7}  # each scope's tree counts its tokens
    clock.now += 1  # the PUBLIC entry expires: the tenant's note did not refresh it
    assert match(index, [1, 2, 3, 4], "tenant-b") == {}
    assert match(index, [1, 2, 3, 4], "tenant-a") == {"w": 4}


WORKERS = ["w0", "w1", "oa"]  # "oa" is approximate: a 5 s TTL against 2 s
SCOPES = ["tenant-a", "tenant-b", PUBLIC]
tokens = st.lists(st.integers(0, 2), min_size=0, max_size=12)


def ttl(worker_id: str) -> float:
    return CONFIG.approximate_ttl_s if worker_id == "oa" else CONFIG.speculative_ttl_s


class RoutedModel:
    """Brute force: per worker noted since its reset, every (time, key, scope,
    confirmed) noted and every (time, key, scope) confirmed."""

    def __init__(self) -> None:
        self.notes: dict[str, list[tuple[float, tuple[int, ...], str, bool]]] = {}
        self.confirms: dict[str, list[tuple[float, tuple[int, ...], str]]] = {}

    def live(self, worker_id: str, now: float) -> list[tuple[tuple[int, ...], str]]:
        return [(key, scope) for t, key, scope, _ in self.notes[worker_id]
                if t > now - ttl(worker_id)]

    def is_confirmed(self, worker_id: str, prefix: tuple[int, ...], scope: str,
                     now: float) -> bool:
        """Whether the worker's live entry for ``prefix`` is confirmed: a confirmed note
        or a confirm covering it since its entry was made (the first note after a gap
        of a TTL, when the entry had expired)."""
        def covers(key: tuple[int, ...], key_scope: str) -> bool:
            return key_scope == scope and key[: len(prefix)] == prefix

        times = [(t, confirmed) for t, key, s, confirmed in self.notes[worker_id]
                 if covers(key, s)]
        if not times or times[-1][0] <= now - ttl(worker_id):
            return False
        start = times[0][0]
        for (before, _), (t, _) in pairwise(times):
            start = t if t - before >= ttl(worker_id) else start
        return (any(confirmed for t, confirmed in times if t >= start)
                or any(t >= start and covers(key, s)
                       for t, key, s in self.confirms.get(worker_id, [])))

    def confirmed_match(self, worker_id: str, query: list[int], scope: str,
                        now: float) -> int:
        return max((i for i in range(1, len(query) + 1) for s in (scope, PUBLIC)
                    if self.is_confirmed(worker_id, tuple(query[:i]), s, now)), default=0)

    def match(self, query: list[int], scope: str, now: float) -> dict[str, int]:
        found = {}
        for worker_id in self.notes:
            visible = [key for key, s in self.live(worker_id, now) if s in (scope, PUBLIC)]
            best = max((common_prefix_length(query, key) for key in visible), default=0)
            if best:
                found[worker_id] = best
        return found

    def num_tokens(self, now: float) -> dict[str, int]:
        """Distinct (scope, prefix) pairs of live keys: the tokens of the nodes held."""
        return {worker_id: len({(scope, key[:i]) for key, scope in self.live(worker_id, now)
                                for i in range(1, len(key) + 1)})
                for worker_id in self.notes}


class ApproxMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.index, self.clock = make_index(oa=100_000)
        self.model = RoutedModel()
        self.keys: list[list[int]] = []

    @rule(worker_id=st.sampled_from(WORKERS), key=tokens, scope=st.sampled_from(SCOPES),
          confirmed=st.booleans())
    def note_routed(self, worker_id: str, key: list[int], scope: str, confirmed: bool) -> None:
        self.index.note_routed(NS, worker_id, to_key(key), scope, confirmed)
        self.model.notes.setdefault(worker_id, []).append(
            (self.clock.now, tuple(key), scope, confirmed))
        self.keys.append(key)

    @rule(worker_id=st.sampled_from(WORKERS), pick=st.integers(0, 1_000))
    def confirm_routed(self, worker_id: str, pick: int) -> None:
        """Confirm one of the worker's live keys, as its request's first token does."""
        live = self.model.live(worker_id, self.clock.now) if worker_id in self.model.notes else []
        if live:
            key, scope = live[pick % len(live)]
            self.index.confirm_routed(NS, worker_id, to_key(list(key)), scope)
            self.model.confirms.setdefault(worker_id, []).append((self.clock.now, key, scope))

    @rule(seconds=st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0]))
    def advance(self, seconds: float) -> None:
        self.clock.now += seconds

    @rule(worker_id=st.sampled_from(WORKERS))
    def reset_worker(self, worker_id: str) -> None:
        self.index.reset_worker(worker_id)
        self.model.notes.pop(worker_id, None)
        self.model.confirms.pop(worker_id, None)

    @rule(query=tokens, scope=st.sampled_from([*SCOPES, "tenant-c"]))
    def random_query(self, query: list[int], scope: str) -> None:
        self.check_query(query, scope)

    def check_query(self, query: list[int], scope: str) -> None:
        found, routed, got_unconfirmed = self.index.match_routed(NS, to_key(query), scope)
        want = self.model.match(query, scope, self.clock.now)
        assert found == want, (query, scope)
        assert routed == {w: n for w, n in want.items() if w != "oa"}, (query, scope)
        num_confirmed = (self.model.confirmed_match("oa", query, scope, self.clock.now)
                         if "oa" in want else 0)
        unconfirmed = {"oa": want["oa"] - num_confirmed} if num_confirmed < want.get("oa", 0) else {}
        assert got_unconfirmed == unconfirmed, (query, scope)

    @invariant()
    def index_matches_the_model(self) -> None:
        self.index.check_invariants()
        for key in self.keys[-4:]:
            for scope in SCOPES:
                self.check_query(key + [9], scope)
                self.check_query(key[: len(key) // 2 + 1], scope)
        now = self.clock.now
        assert self.index.stats().num_approx_tokens == self.model.num_tokens(now)
        self.index.check_invariants()


ApproxMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_approx_index_matches_brute_force = ApproxMachine.TestCase
