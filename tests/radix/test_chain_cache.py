"""ChainCache against a brute-force model: the same lookups, the same links held, the
same evictions (least recently used, a chain's deeper links first), within budget, and
a scope never sees another scope's links."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from radix.chain_cache import ChainCache, chain_digests
from radix.tree import PUBLIC, Scope

SCOPES = [Scope("a"), Scope("b"), PUBLIC]


class Model:
    """Links as a plain dict with a use counter per key; eviction takes the smallest."""

    def __init__(self, max_units: int) -> None:
        self.max_units = max_units
        self.links: dict[tuple, tuple] = {}  # key -> (parent, value, units)
        self.used: dict[tuple, int] = {}
        self.clock = 0

    def longest(self, scope, digests):
        found, parent = [], None
        for digest in digests:
            candidates = [(scope, digest)] + ([(PUBLIC, digest)] if scope != PUBLIC else [])
            match = [k for k in candidates if k in self.links and self.links[k][0] == parent]
            if not match:
                break
            found.append((match[0], self.links[match[0]][1]))
            parent = match[0]
        return found

    def extend(self, scope, found, new):
        chain = list(found)
        parent = chain[-1] if chain else None
        for digest, value, units in new if not found or found[-1] in self.links else ():
            key = (scope, digest)
            if key in self.links and self.links[key][0] != parent:
                break
            self.links.setdefault(key, (parent, value, units))
            chain.append(key)
            parent = key
        for key in reversed(chain):
            self.clock += 1
            self.used[key] = self.clock
        while sum(units for _, _, units in self.links.values()) > self.max_units:
            oldest = min(self.links, key=self.used.__getitem__)
            del self.links[oldest]


def _items(words):
    return [w.encode() for w in words]


WORDS = st.lists(st.sampled_from(["a", "b", "c", "d"]), min_size=0, max_size=6)
OPS = st.lists(st.tuples(st.sampled_from(SCOPES), WORDS, st.integers(1, 6)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(ops=OPS, budget=st.integers(1, 60))
def test_the_cache_matches_a_brute_force_model(ops, budget):
    cache, model = ChainCache(budget), Model(budget)
    for scope, words, units in ops:
        digests = chain_digests(_items(words), 0)
        found = cache.longest(scope, digests)
        assert found == model.longest(scope, digests)
        keys = [key for key, _ in found]
        new = [(d, (scope, words[: i + 1]), units) for i, d in enumerate(digests)][len(found):]
        cache.extend(scope, keys, new)
        model.extend(scope, keys, new)
        cache.check_invariants()
        assert cache.num_units() == sum(u for _, _, u in model.links.values()) <= budget
        for probe_scope in SCOPES:
            assert cache.longest(probe_scope, digests) == model.longest(probe_scope, digests)


@settings(max_examples=200, deadline=None)
@given(ops=OPS)
def test_a_scope_sees_only_its_own_and_public_links(ops):
    cache = ChainCache(10_000)
    for scope, words, units in ops:
        digests = chain_digests(_items(words), 0)
        found = cache.longest(scope, digests)
        assert all(key[0] in (scope, PUBLIC) for key, _ in found)
        assert all(value[0] in (scope, PUBLIC) for _, value in found)  # stored by them
        new = [(d, (scope, words[: i + 1]), units) for i, d in enumerate(digests)][len(found):]
        cache.extend(scope, [key for key, _ in found], new)


def test_eviction_takes_the_least_recently_used_chain_deepest_link_first():
    cache = ChainCache(4)
    one = chain_digests(_items("xy"), 0)
    two = chain_digests(_items("z"), 0)
    cache.extend(Scope("a"), [], [(one[0], "x", 1), (one[1], "xy", 1)])
    cache.extend(Scope("a"), [], [(two[0], "z", 1)])
    cache.extend(Scope("a"), [key for key, _ in cache.longest(Scope("a"), one)], [])
    extra = chain_digests(_items("w"), 0)
    cache.extend(Scope("a"), [], [(extra[0], "w", 2)])  # 5 units: "z" is the oldest
    assert [v for _, v in cache.longest(Scope("a"), one)] == ["x", "xy"]
    assert cache.longest(Scope("a"), two) == []
    cache.extend(Scope("a"), [], [(two[0], "z", 1)])  # now "xy" then "x" go, deepest first
    assert [v for _, v in cache.longest(Scope("a"), one)] == ["x"]
    cache.check_invariants()


def test_last_child_is_the_newest_link_added_under_a_link_in_its_own_scope():
    cache = ChainCache(100)
    a, b = Scope("a"), Scope("b")
    base = chain_digests(_items(["p"]), 0)
    cache.extend(PUBLIC, [], [(base[0], "p", 1)])
    (public_key, _), = cache.longest(a, base)
    for scope, word in ((PUBLIC, "q"), (a, "r")):
        digest = chain_digests(_items(["p", word]), 0)[1]
        cache.extend(scope, [public_key], [(digest, word, 1)])
    assert cache.last_child(public_key) == "q"  # a's child is not a public link's
    cache.extend(a, [], [(chain_digests(_items(["s"]), 0)[0], "s", 1)])
    (own_key, _), = cache.longest(a, chain_digests(_items(["s"]), 0))
    assert cache.last_child(own_key) is None
    cache.extend(a, [own_key], [(chain_digests(_items(["s", "t"]), 0)[1], "t", 1)])
    assert cache.last_child(own_key) == "t" and cache.longest(b, base) != []


def test_a_link_over_the_whole_budget_is_evicted_at_once():
    cache = ChainCache(5)
    digests = chain_digests(_items("ab"), 0)
    cache.extend(Scope("a"), [], [(digests[0], "a", 3), (digests[1], "ab", 3)])
    assert cache.num_units() <= 5 and cache.num_links() <= 1
    cache.check_invariants()
