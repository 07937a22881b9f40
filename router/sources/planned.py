"""What this router has planned and not yet seen happen: each peer's link queue
(``PeerLinks``) and the pulls on their way (``PendingPulls``), for the source planner
(``router.sources.service``)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import NamedTuple

MAX_PENDING = 1024


class PeerLinks:
    """When each peer's outgoing link is free of the pulls this router planned from
    it (monotonic seconds): a new pull waits for those before its own bytes cross."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._free_at: dict[str, float] = {}

    def wait_s(self, worker_id: str) -> float:
        """Seconds until ``worker_id``'s link is free of the pulls planned so far."""
        return max(0.0, self._free_at.get(worker_id, 0.0) - self._clock())

    def reserve(self, worker_id: str, seconds: float, ends_in_s: float = 0.0) -> None:
        """Queue a pull of ``seconds`` on ``worker_id``'s link, busy at least
        ``ends_in_s`` from now (a relay sends its last block once that has come)."""
        now = self._clock()
        self._free_at[worker_id] = max(max(now, self._free_at.get(worker_id, now)) + seconds,
                                       now + ends_in_s)


class Pending(NamedTuple):
    """A planned pull: into ``worker_id``, the prompt's first blocks ``key`` (radix
    bytes) of ``namespace`` and ``scope``, from ``source``, predicted whole at
    ``ready_at``."""

    worker_id: str
    namespace: str
    scope: str
    key: bytes
    ready_at: float
    source: str


class PendingPulls:
    """The pulls this router planned lately (module docstring): kept ``grace_s`` past
    their predicted end (by then the worker's KV events say what it holds), at most
    ``MAX_PENDING``."""

    def __init__(self, grace_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._grace_s = grace_s
        self._clock = clock
        self._entries: list[Pending] = []

    def add(self, pending: Pending) -> None:
        """Record a planned pull."""
        self._entries.append(pending)
        del self._entries[: max(0, len(self._entries) - MAX_PENDING)]

    def discard(self, pending: Pending) -> None:
        """Forget a planned pull that will not happen (its hold failed)."""
        with contextlib.suppress(ValueError):
            self._entries.remove(pending)

    def holders(self, namespace: str, scope: str, key: bytes) -> list[Pending]:
        """The pending pulls of a prefix of ``key`` in ``namespace`` and ``scope``."""
        now = self._clock()
        self._entries = [p for p in self._entries if p.ready_at + self._grace_s > now]
        return [p for p in self._entries if p.namespace == namespace and p.scope == scope
                and key.startswith(p.key)]
