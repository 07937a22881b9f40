"""Whether routing trusts a followed worker's exact index entries (docs/router.md,
"Stale workers").

A worker whose KV events the router follows is *exact* while its follower is
connected and caught up, and *stale* from the moment that stops being true: its
stream went silent past ``kv_events.read_timeout_s``, ended, jumped (a gap, a new
epoch, a malformed frame) or is reconnecting, until a replay or a snapshot has rebuilt
its entries. A stale worker's exact entries stay in the index (a resumed stream builds
on them) but are not matched: it is routed by what the router sent it since, kept as
approximate entries (``RouterIndex.set_stale``), and by load.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from router.fleet.worker_state import WorkerState
from router.routing.index import WorkerId

log = logging.getLogger(__name__)


class TrustMarks(Protocol):
    """What ``StreamHealth`` needs of the router index (``RouterIndex`` has both)."""

    def set_stale(self, worker_id: WorkerId) -> None:
        """Stop matching the worker's exact entries."""

    def set_exact(self, worker_id: WorkerId) -> None:
        """Match them again."""


class StreamHealth:
    """One followed worker's stream as routing trusts it. ``heard`` stamps an event or
    heartbeat (``WorkerState.events_heard_at``); ``stale`` stops trusting the worker's
    exact entries and ``rebuilt`` trusts them again, each idempotent and recorded on
    the ``WorkerState`` (``index_mode``, ``index_reason``, ``index_since``) for
    ``GET /admin/workers`` and the gauges (``router.fleet.events.metrics``)."""

    def __init__(self, worker: WorkerState, index: TrustMarks,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.worker = worker
        self._index = index
        self._clock = clock

    @property
    def is_stale(self) -> bool:
        """Whether the worker's exact entries are not trusted now."""
        return self.worker.index_mode == "stale"

    def started(self, reason: str) -> None:
        """Following begins: stale for ``reason`` until caught up (no warning: this is
        no fault), and the stream's age counts from now until it first delivers."""
        self.worker.events_heard_at = self._clock()
        self._mark_stale(reason)

    def heard(self) -> None:
        """The stream delivered an event or a heartbeat."""
        self.worker.events_heard_at = self._clock()

    def stale(self, reason: str) -> None:
        """Stop trusting the worker's exact entries, for ``reason``."""
        if not self.is_stale:
            log.warning("worker %s routed stale: %s", self.worker.worker_id, reason)
        self._mark_stale(reason)

    def rebuilt(self) -> None:
        """The stream is caught up: trust the worker's exact entries again."""
        if self.is_stale:
            log.info("worker %s routed exact: its KV events are caught up",
                     self.worker.worker_id)
            self._index.set_exact(WorkerId(self.worker.worker_id))
            self.worker.set_index_mode("exact", "")

    def stopped(self) -> None:
        """Following ended (the worker left routing, or the router stops): stale, without
        the warning a fault gets."""
        self._mark_stale("its KV events are not followed")

    def _mark_stale(self, reason: str) -> None:
        self._index.set_stale(WorkerId(self.worker.worker_id))
        self.worker.set_index_mode("stale", reason)
