"""Prefix reuse as a worker sees it: the longest prefix of each prompt it had seen before.

``ReuseMeter`` is what the reference harness's stand-in workers keep (and what the
harness replays a trace through for the single-worker bound): two ``RadixTree`` of
the prompts seen so far, one unlimited and one holding at most ``lru_tokens`` (LRU
leaf eviction, as a worker's prefix cache under memory pressure). Reuse is the sum
of matched tokens over the sum of prompt tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from radix.keys import to_key
from radix.tree import PUBLIC, RadixTree


@dataclass(frozen=True)
class ReuseStats:
    """Counts since the last reset: prompts, their tokens, and the tokens of each that
    the unlimited and the LRU tree already held; ``num_working_set_tokens`` is the
    unlimited tree's size (every distinct prefix seen)."""

    num_requests: int
    num_prompt_tokens: int
    num_seen_tokens: int
    num_seen_lru_tokens: int
    num_working_set_tokens: int

    def to_dict(self) -> dict[str, int]:
        """JSON-ready."""
        return asdict(self)


class ReuseMeter:
    """Prompts seen so far, unlimited and under an LRU cap of ``lru_tokens`` (None:
    no capped tree; its reuse then reads 0). ``observe`` matches before inserting, so
    a prompt never counts itself."""

    def __init__(self, lru_tokens: int | None = None):
        self.lru_tokens = lru_tokens
        self.reset()

    def reset(self) -> None:
        """Forget every prompt and count."""
        self._unlimited: RadixTree[None] = RadixTree()
        self._lru: RadixTree[None] = RadixTree()
        self._counts = [0, 0, 0, 0]

    def observe(self, token_ids: Sequence[int]) -> int:
        """Count one prompt; returns the tokens the unlimited tree already held."""
        key = to_key(list(token_ids))
        seen = self._unlimited.match(key, PUBLIC).num_matched_tokens
        self._unlimited.insert(key, PUBLIC)
        seen_lru = 0
        if self.lru_tokens is not None:
            seen_lru = self._lru.match(key, PUBLIC).num_matched_tokens
            self._lru.insert(key, PUBLIC)
            excess = self._lru.num_tokens() - self.lru_tokens
            if excess > 0:
                self._lru.evict(excess)
        for i, value in enumerate((1, len(token_ids), seen, seen_lru)):
            self._counts[i] += value
        return seen

    def stats(self) -> ReuseStats:
        """The counts since the last reset."""
        return ReuseStats(*self._counts, self._unlimited.num_tokens())
