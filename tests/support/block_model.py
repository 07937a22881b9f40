"""Brute force of what the router's exact index must answer (``BlockIndex``'s rule).

Every worker's held blocks, rebuilt from the events alone: (tier, scope, hash) -> the
block's full token path. A worker holds a path visibly to a scope when it holds a block
of that path in the scope or PUBLIC. Its chain for a query at a level (device; device or
host; any tier) is the number of the query's full blocks whose prefixes it holds at
that level, from the first without a gap. The walk ends at D, the longest chain of any
worker; a worker whose chain reaches D also gets the longest partial block it holds
that the query continues with there. Credits weigh host and disk tokens.
"""

from __future__ import annotations

from radix.events import KVEvent
from radix.tree import PUBLIC

TIERS = ("device", "host", "disk")


class BlockModel:
    """The brute-force index (module docstring)."""

    def __init__(self, host_weight: float = 1.0, disk_weight: float = 1.0) -> None:
        self.host_weight, self.disk_weight = host_weight, min(disk_weight, host_weight)
        self.held: dict[str, dict[tuple[str, str, str], tuple[int, ...]]] = {}
        self.block_size: int | None = None

    def apply(self, worker: str, event: KVEvent) -> None:
        """Apply one event as the index's contract says."""
        held = self.held.setdefault(worker, {})
        if event.type == "cleared":
            held.clear()
            return
        for block in event.blocks:
            place = (event.medium, event.scope, block.hash)
            if event.type == "removed":
                held.pop(place, None)
                continue
            if place in held:
                continue
            if block.parent is None:
                prefix: tuple[int, ...] | None = ()
            else:
                prefix = next((path for (_, scope, h), path in held.items()
                               if h == block.parent and scope in (event.scope, PUBLIC)), None)
                if prefix is not None and self.block_size is None and prefix:
                    self.block_size = len(prefix)
            if prefix is not None:
                held[place] = prefix + (block.tokens or ())

    def match(self, query: list[int], scope: str) -> dict[str, int]:
        """Credits per worker (workers with none left out)."""
        tokens = {level: {} for level in range(3)}
        depth = max((self._chain(w, query, scope, 2) for w in self.held), default=0)
        size = self.block_size or 0
        for worker in self.held:
            for level in range(3):
                chain = self._chain(worker, query, scope, level)
                got = chain * size
                if chain == depth:
                    got += self._partial(worker, query, scope, level, chain * size)
                if got:
                    tokens[level][worker] = got
        credits = {}
        for worker, num_any in tokens[2].items():
            num_device = tokens[0].get(worker, 0)
            num_host = max(tokens[1].get(worker, 0), num_device)
            credits[worker] = int(num_device + self.host_weight * (num_host - num_device)
                                  + self.disk_weight * (num_any - num_host))
        return credits

    def _paths(self, worker: str, scope: str, level: int) -> set[tuple[int, ...]]:
        return {path for (tier, held_scope, _), path in self.held[worker].items()
                if TIERS.index(tier) <= level and held_scope in (scope, PUBLIC)}

    def _chain(self, worker: str, query: list[int], scope: str, level: int) -> int:
        if not self.block_size:
            return 0
        paths, size, num = self._paths(worker, scope, level), self.block_size, 0
        while (num + 1) * size <= len(query) and tuple(query[: (num + 1) * size]) in paths:
            num += 1
        return num

    def _partial(self, worker: str, query: list[int], scope: str, level: int,
                 start: int) -> int:
        longest = 0
        for path in self._paths(worker, scope, level):
            part = len(path) - start
            if (part > 0 and (not self.block_size or part < self.block_size)
                    and tuple(query[: len(path)]) == path and part > longest):
                longest = part
        return longest
