"""``ServedWindow``: tokens dispatched per fairness id over a sliding window, and Jain's
fairness index over them.

Each dispatch adds its token cost divided by its flow's weight, so equal weighted
shares give equal numbers. Jain's index of x_1..x_n is (sum x)^2 / (n * sum x^2):
1.0 when every flow got the same, 1/n when one got everything. Only flows that
were served in the window count, so a flow with no demand does not lower it.
"""

from __future__ import annotations

from collections import deque


class ServedWindow:
    """Weighted tokens dispatched per flow over the last ``window_s`` seconds."""

    def __init__(self, window_s: float) -> None:
        self._window_s = window_s
        self._events: deque[tuple[float, str, float]] = deque()
        self._totals: dict[str, float] = {}

    def add(self, now: float, flow: str, weighted_tokens: float) -> None:
        """Record a dispatch of ``weighted_tokens`` (cost / weight) for ``flow``."""
        self._events.append((now, flow, weighted_tokens))
        self._totals[flow] = self._totals.get(flow, 0.0) + weighted_tokens
        self._trim(now)

    def totals(self, now: float) -> dict[str, float]:
        """Weighted tokens per flow served within the window (a copy)."""
        self._trim(now)
        return dict(self._totals)

    def jain_index(self, now: float) -> float:
        """Jain's index over the flows served in the window; 1.0 with fewer than two."""
        self._trim(now)
        shares = [v for v in self._totals.values() if v > 0]
        if len(shares) < 2:
            return 1.0
        return sum(shares) ** 2 / (len(shares) * sum(v * v for v in shares))

    def _trim(self, now: float) -> None:
        while self._events and now - self._events[0][0] > self._window_s:
            _, flow, tokens = self._events.popleft()
            left = self._totals[flow] - tokens
            if left <= 1e-9:
                del self._totals[flow]
            else:
                self._totals[flow] = left
