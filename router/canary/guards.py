"""A pool's recent requests and the guards that judge them.

``GuardWindow`` keeps the outcome of each request a pool finished in the last
``window_s`` seconds, at most the latest ``MAX_OUTCOMES`` of them (whether it was a
5xx, and its time to first byte if it got one); ``judge`` says whether a pool's
window trips a guard. Recording is O(1) on the request path; the p99 is computed
only when the guard loop asks, over a bounded number of outcomes, so a pool with
all the traffic does not hold the event loop for long.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from router.canary.pools import Trip
from router.config import CanaryConfig


@dataclass(frozen=True)
class WindowSummary:
    """A window's requests, 5xx answers among them, and the p99 of the times to first
    byte (None when no request got a first byte)."""

    num_requests: int
    num_errors: int
    ttft_p99_s: float | None

    @property
    def error_rate(self) -> float:
        """5xx answers over requests (0 with no request)."""
        return self.num_errors / self.num_requests if self.num_requests else 0.0

    def to_dict(self) -> dict[str, object]:
        """JSON view for ``GET /admin/canary``."""
        return {"num_requests": self.num_requests, "num_errors": self.num_errors,
                "error_rate": self.error_rate, "ttft_p99_s": self.ttft_p99_s}


MAX_OUTCOMES = 4096


class GuardWindow:
    """Outcomes of one pool's requests over a sliding window of ``window_s`` seconds
    (``time.monotonic()``, given by the caller), the latest ``max_outcomes`` at
    most."""

    __slots__ = ("_window_s", "_outcomes")

    def __init__(self, window_s: float, max_outcomes: int = MAX_OUTCOMES) -> None:
        self._window_s = window_s
        self._outcomes: deque[tuple[float, bool, float | None]] = deque(maxlen=max_outcomes)

    def record(self, now: float, is_error: bool, ttft_s: float | None) -> None:
        """Add one finished request."""
        self._outcomes.append((now, is_error, ttft_s))
        self._expire(now)

    def clear(self) -> None:
        """Forget every outcome (a pool re-enabled starts from a clean window)."""
        self._outcomes.clear()

    def summary(self, now: float) -> WindowSummary:
        """The window's counts and TTFT p99 (nearest rank) as of ``now``."""
        self._expire(now)
        ttfts = sorted(t for _, _, t in self._outcomes if t is not None)
        p99 = ttfts[max(math.ceil(0.99 * len(ttfts)) - 1, 0)] if ttfts else None
        return WindowSummary(len(self._outcomes), sum(e for _, e, _ in self._outcomes), p99)

    def _expire(self, now: float) -> None:
        horizon = now - self._window_s
        outcomes = self._outcomes
        while outcomes and outcomes[0][0] < horizon:
            outcomes.popleft()


def judge(summary: WindowSummary, config: CanaryConfig) -> Trip | None:
    """The guard ``summary`` trips (error rate first), or None; a window with fewer
    than ``min_requests`` requests trips nothing."""
    if summary.num_requests < config.min_requests:
        return None
    if config.max_error_rate is not None and summary.error_rate > config.max_error_rate:
        return Trip("error_rate", f"{summary.num_errors} of {summary.num_requests} requests "
                                  f"failed (above {config.max_error_rate:g})")
    if (config.max_ttft_p99_s is not None and summary.ttft_p99_s is not None
            and summary.ttft_p99_s > config.max_ttft_p99_s):
        return Trip("ttft_p99", f"TTFT p99 {summary.ttft_p99_s:.3f} s over "
                                f"{summary.num_requests} requests (above "
                                f"{config.max_ttft_p99_s:g} s)")
    return None
