"""State that several routers would share: per-tenant concurrency slots and token windows.

``SharedState`` is the seam; ``InProcessSharedState`` is the null object used when
no Redis is configured (the embedded default, a single router process): each router
process then enforces limits on its own traffic only (``--processes N`` gives each a
1/N share). ``router.state.redis_state.RedisSharedState`` shares them through Redis. Every operation is a single
atomic check-and-update, so a networked implementation can map each to one script.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class SharedState(Protocol):
    """Counters keyed by tenant id. All methods are atomic with respect to each other."""

    async def acquire_slot(self, key: str, limit: int) -> bool:
        """Take one of ``limit`` concurrency slots of ``key``; False (nothing taken) if full."""
        ...

    async def release_slot(self, key: str) -> None:
        """Give back one slot taken by ``acquire_slot``."""
        ...

    async def reserve_tokens(self, key: str, reservation_id: str, num_tokens: int,
                             limit: int) -> float | None:
        """Record ``num_tokens`` in ``key``'s sliding window under ``reservation_id`` if
        the window total stays within ``limit``: returns None. Otherwise records nothing
        and returns the seconds until enough old entries expire for it to fit."""
        ...

    async def settle_tokens(self, key: str, reservation_id: str, num_reserved: int,
                            num_admitted: int, num_produced: int) -> None:
        """Settle the reservation ``reservation_id`` (``num_reserved`` tokens): it keeps
        ``num_admitted`` (the prompt) at its time, and ``num_produced`` (the output) is
        recorded now, when it was produced, so a long stream's output stays in the
        window for a whole window after it. If the reservation already left the window
        (a request that ran longer than the window), only the tokens above
        ``num_reserved`` are recorded now: what was used is always charged."""
        ...

    async def tokens_in_window(self, key: str) -> int:
        """The total recorded in ``key``'s window now."""
        ...


@dataclass(slots=True)
class _WindowEntry:
    recorded_at: float
    num_tokens: int
    reservation_id: str


class InProcessSharedState:
    """``SharedState`` in this process's memory (the no-Redis null object).

    The token window (``window_s`` long) is a deque of entries (time, tokens,
    reservation id) with a running sum: each call drops expired entries from the left, so cost
    is amortized O(1) per recorded entry. A dict finds an entry by reservation id for
    ``settle_tokens``.
    """

    def __init__(
        self, window_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        self._window_s = window_s
        self._clock = clock
        self._slots: dict[str, int] = {}
        self._windows: dict[str, deque[_WindowEntry]] = {}
        self._window_sums: dict[str, int] = {}
        self._reservations: dict[str, _WindowEntry] = {}

    async def acquire_slot(self, key: str, limit: int) -> bool:
        """See ``SharedState.acquire_slot``."""
        used = self._slots.get(key, 0)
        if used >= limit:
            return False
        self._slots[key] = used + 1
        return True

    async def release_slot(self, key: str) -> None:
        """See ``SharedState.release_slot``; an extra release is ignored."""
        used = self._slots.get(key, 0)
        if used <= 1:
            self._slots.pop(key, None)
        else:
            self._slots[key] = used - 1

    async def reserve_tokens(self, key: str, reservation_id: str, num_tokens: int,
                             limit: int) -> float | None:
        """See ``SharedState.reserve_tokens``."""
        now = self._clock()
        window = self._expire(key, now)
        total = self._window_sums.get(key, 0)
        if total + num_tokens <= limit:
            entry = _WindowEntry(now, num_tokens, reservation_id)
            window.append(entry)
            self._reservations[reservation_id] = entry
            self._window_sums[key] = total + num_tokens
            return None
        excess = total + num_tokens - limit
        for entry in window:
            excess -= entry.num_tokens
            if excess <= 0:
                return max(entry.recorded_at + self._window_s - now, 0.0)
        return self._window_s

    async def settle_tokens(self, key: str, reservation_id: str, num_reserved: int,
                            num_admitted: int, num_produced: int) -> None:
        """See ``SharedState.settle_tokens``."""
        now = self._clock()
        window = self._expire(key, now)
        entry = self._reservations.pop(reservation_id, None)
        if entry is not None:
            self._window_sums[key] += num_admitted - entry.num_tokens
            entry.num_tokens = num_admitted
            num_now = num_produced
        else:
            num_now = num_admitted + num_produced - num_reserved
        if num_now > 0:
            window.append(_WindowEntry(now, num_now, reservation_id))
            self._window_sums[key] = self._window_sums.get(key, 0) + num_now

    async def tokens_in_window(self, key: str) -> int:
        """See ``SharedState.tokens_in_window``."""
        self._expire(key, self._clock())
        return self._window_sums.get(key, 0)

    def _expire(self, key: str, now: float) -> deque[_WindowEntry]:
        window = self._windows.setdefault(key, deque())
        horizon = now - self._window_s
        while window and window[0].recorded_at <= horizon:
            entry = window.popleft()
            self._window_sums[key] -= entry.num_tokens
            self._reservations.pop(entry.reservation_id, None)
        return window

