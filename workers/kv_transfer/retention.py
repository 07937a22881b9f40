"""``Retainer``: keeps a returning session's blocks cached for the seconds its client
hinted, ahead of LRU (docs/kv-cache.md, "Sessions that return").

After a request that names a session and a retention hint has run, the worker pins the
whole blocks of its prompt cached for its scope (``KVCacheManager.pin`` through the
``PinLedger``: referenced like a running sequence's blocks, so no eviction takes them)
until the hint's deadline; the session's next request replaces the pin with its own
(one retention per session and scope). Bounded: a hint counts at most
``max_retention_s``; all sessions keep at most ``max_retained_blocks`` and one tenant
scope's at most ``max_scope_retained_blocks``, never past the scope's cache quota (a
kept block still counts in it). A retention past its scope's bound first lets go of
that scope's retentions nearest their deadlines (``displaced``); one past the
worker's bound, or alone past its scope's, is refused. At the deadline (the
housekeeping's ``expire``) the blocks become ordinary cached blocks, the least
recently used, so the next eviction takes them first.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from workers.kv.ids import SeqId
from workers.kv_transfer.pins import PinLedger

OUTCOMES = ("kept", "replaced", "expired", "displaced", "refused")


@dataclass(frozen=True)
class RetentionLimits:
    """The longest hint honoured, and the most blocks all retentions and one scope's
    keep."""

    max_retention_s: float
    max_retained_blocks: int
    max_scope_retained_blocks: int


@dataclass(frozen=True)
class _Retained:
    pin_id: SeqId
    num_blocks: int
    deadline: float


class Retainer:
    """The retained sessions of one worker (module docstring; loop thread only)."""

    def __init__(self, ledger: PinLedger, limits: RetentionLimits, block_size: int,
                 registry: CollectorRegistry, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self._ledger = ledger
        self.limits = limits
        self._block_size = block_size
        self._clock = clock
        self._held: dict[tuple[str, str], _Retained] = {}
        self._pending: set[asyncio.Task[int]] = set()
        outcomes = Counter("kv_retentions", "Session retentions by how they began or ended: "
                           "kept, replaced (by the session's next request), expired, "
                           "displaced (by a newer one of its scope), refused (past a bound)",
                           ["outcome"], registry=registry)
        self._outcomes = {outcome: outcomes.labels(outcome) for outcome in OUTCOMES}
        Gauge("kv_retained_blocks", "KV blocks kept for returning sessions",
              registry=registry).set_function(lambda: self.num_retained_blocks())

    def num_retained_blocks(self, scope: str | None = None) -> int:
        """Blocks kept for sessions now (only ``scope``'s, when given)."""
        return sum(r.num_blocks for (s, _), r in self._held.items()
                   if scope is None or s == scope)

    async def retain(self, key: bytes, scope: str, session_id: str, seconds: float,
                     max_cached_tokens: int | None) -> int:
        """Keep the cached whole blocks of the prompt ``key`` for ``scope`` for
        ``seconds`` (at most ``max_retention_s``) as session ``session_id``'s, replacing
        its earlier retention; ``max_cached_tokens`` is the scope's cache quota (None:
        none). Returns the blocks kept (0: none cached, or refused)."""
        await self.release(scope, session_id, "replaced")
        pin_id, block_ids = await self._ledger.pin(lambda e, p: e.manager.pin(p, key, scope))
        num_blocks = len(block_ids)
        quota = (math.inf if max_cached_tokens is None
                 else max_cached_tokens // self._block_size)
        scope_cap = min(self.limits.max_scope_retained_blocks, quota)
        if num_blocks and num_blocks <= scope_cap:
            await self._displace(scope, scope_cap - num_blocks)
        if (not num_blocks or num_blocks > scope_cap
                or self.num_retained_blocks() + num_blocks > self.limits.max_retained_blocks):
            await self._ledger.free(pin_id)
            if num_blocks:
                self._outcomes["refused"].inc()
            return 0
        deadline = self._clock() + min(seconds, self.limits.max_retention_s)
        self._held[(scope, session_id)] = _Retained(pin_id, num_blocks, deadline)
        self._outcomes["kept"].inc()
        return num_blocks

    def retain_later(self, key: bytes, scope: str, session_id: str, seconds: float,
                     max_cached_tokens: int | None) -> None:
        """``retain`` in a task of its own: safe while the caller is being cancelled (a
        client that hung up as its answer ended still has its session kept)."""
        task = asyncio.get_running_loop().create_task(
            self.retain(key, scope, session_id, seconds, max_cached_tokens))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def release(self, scope: str, session_id: str, outcome: str) -> bool:
        """Let session ``session_id``'s retention go (counted as ``outcome``); False
        when it kept none."""
        retained = self._held.pop((scope, session_id), None)
        if retained is None:
            return False
        self._outcomes[outcome].inc()
        await self._ledger.free(retained.pin_id)
        return True

    async def expire(self) -> int:
        """Let every retention past its deadline go; how many."""
        now = self._clock()
        due = [key for key, r in self._held.items() if r.deadline <= now]
        for scope, session_id in due:
            await self.release(scope, session_id, "expired")
        return len(due)

    async def close(self) -> None:
        """Cancel the retentions on their way and let every retention go."""
        for task in list(self._pending):
            task.cancel()
        await asyncio.gather(*self._pending, return_exceptions=True)
        for scope, session_id in list(self._held):
            await self.release(scope, session_id, "expired")

    async def _displace(self, scope: str, max_blocks: int) -> None:
        """Let ``scope``'s retentions nearest their deadlines go until it keeps at most
        ``max_blocks``."""
        mine = sorted((r.deadline, s) for (sc, s), r in self._held.items() if sc == scope)
        for _, session_id in mine:
            if self.num_retained_blocks(scope) <= max_blocks:
                return
            await self.release(scope, session_id, "displaced")
