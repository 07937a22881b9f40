"""Values keyed by a hash chain, scoped like the prefix index, evicted least recently
used within a budget: the store under the prompt caches (``radix.token_cache``'s text
chunks, ``radix.chat_render``'s rendered messages).

A **chain** is a sequence of items hashed link by link: ``digest_0 = seed``,
``digest_k = xxh3_64(item_k, seed=digest_{k-1})`` (``chain_digests``), so one digest
names the whole sequence up to its item. ``ChainCache`` maps ``(scope, digest)`` to a
``Link``: the owner's value for that item and the key of the link before it. A new
sequence is looked up by its digests from the start (``longest``): one dict lookup per
item, stopping at the first one not held, instead of a walk over the sequence's
characters. Digests may collide: owners compare each found link's value with their
item, so a collision costs a miss, never a wrong answer.

Scopes: a link stored in scope ``S`` serves ``S`` only; ``PUBLIC`` links serve every
scope. A chain may run through public links into a scope's own ones, never the other
way. ``last_child`` remembers the newest link added under a link *in the same scope*,
so it never tells one scope what another one stored.

Eviction: links sit in an ordered dict, least recently used first. ``extend`` adds a
chain's new links, then marks every link of the chain used, deepest first: a link is
always more recent than everything below it, so the front of the dict is always a link
with nothing below it, and evicting from the front never strands a link whose parent
is gone (``check_invariants``). ``num_units`` (the owner's measure of each link) is
within ``max_units`` after every ``extend``; a link alone over it is evicted at once.

Thread-safe: every method holds the cache's lock for its own duration.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Generic, NamedTuple, TypeVar

import xxhash

from radix.tree import PUBLIC, Scope

V = TypeVar("V")
Key = tuple[Scope, int]


def chain_digests(items: Iterable[bytes], seed: int) -> list[int]:
    """``digest_k`` of each item in turn (module docstring)."""
    digests = []
    digest = seed
    hash_ = xxhash.xxh3_64_intdigest
    for item in items:
        digest = hash_(item, digest)
        digests.append(digest)
    return digests


class Link(NamedTuple, Generic[V]):
    """One item's value, the key of the link before it (None at a chain's start) and
    the units it counts against the budget. A tuple, so one holding only strings,
    numbers and arrays is no work for the garbage collector."""

    parent: Key | None
    value: V
    num_units: int


class ChainCache(Generic[V]):
    """Scoped chain links within a budget of ``max_units`` (module docstring)."""

    def __init__(self, max_units: int) -> None:
        self._max_units = max_units
        self._links: OrderedDict[Key, Link[V]] = OrderedDict()
        self._last_child: dict[Key, Key] = {}
        self._num_units = 0
        self._lock = threading.Lock()

    def longest(self, scope: Scope, digests: Sequence[int]) -> list[tuple[Key, V]]:
        """The links of the longest leading run of ``digests`` that ``scope`` sees, each
        the child of the one before; the caller checks the values against its items."""
        found: list[tuple[Key, V]] = []
        parent = None
        get = self._links.get
        with self._lock:
            for digest in digests:
                key = (scope, digest)
                link = get(key)
                if (link is None or link.parent != parent) and scope != PUBLIC:
                    key = (PUBLIC, digest)
                    link = get(key)
                if link is None or link.parent != parent:
                    break
                found.append((key, link.value))
                parent = key
        return found

    def last_child(self, key: Key) -> V | None:
        """The value of the newest link added under ``key`` in ``key``'s scope, if held."""
        with self._lock:
            child = self._links.get(self._last_child.get(key))  # type: ignore[arg-type]
            return child.value if child is not None else None

    def extend(self, scope: Scope, found: Sequence[Key],
               new: Sequence[tuple[int, V, int]]) -> None:
        """Add ``new`` links ((digest, value, units), in order) in ``scope`` after the
        chain ``found`` (keys from ``longest``, in order); mark the whole chain used;
        evict least recently used links until within budget. A key already held keeps
        its link; one held under another parent (a collision, or another thread's
        chain) ends the adding there, as does a link of ``found`` evicted meanwhile."""
        with self._lock:
            links = self._links
            if found and found[-1] not in links:  # held, its ancestors are held too
                new = ()
            chain = list(found)
            parent = chain[-1] if chain else None
            for digest, value, num_units in new:
                key = (scope, digest)
                held = links.get(key)
                if held is None:
                    links[key] = Link(parent, value, num_units)
                    self._num_units += num_units
                    if parent is not None and parent[0] == scope:
                        self._last_child[parent] = key
                elif held.parent != parent:
                    break
                chain.append(key)
                parent = key
            for key in reversed(chain):
                if key in links:
                    links.move_to_end(key)
            while self._num_units > self._max_units and links:
                key, evicted = links.popitem(last=False)
                self._num_units -= evicted.num_units
                self._last_child.pop(key, None)

    def num_units(self) -> int:
        """Units held now; never above ``max_units`` between calls."""
        with self._lock:
            return self._num_units

    def num_links(self) -> int:
        """Links held now."""
        with self._lock:
            return len(self._links)

    def check_invariants(self) -> None:
        """Units add up and are within budget; every link's parent is held, is more
        recent than it, and is in its scope or ``PUBLIC``."""
        with self._lock:
            position = {key: i for i, key in enumerate(self._links)}
            assert sum(link.num_units for link in self._links.values()) == self._num_units
            assert self._num_units <= self._max_units
            assert set(self._last_child) <= set(self._links)
            for key, link in self._links.items():
                if link.parent is not None:
                    assert position.get(link.parent, -1) > position[key], (key, link.parent)
                    assert link.parent[0] in (key[0], PUBLIC), (key, link.parent)
