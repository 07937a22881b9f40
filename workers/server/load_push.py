"""The worker's load, pushed to routers on their KV event streams (``radix.events``,
load frames; docs/protocol.md, "Load frames").

A router that asks for load frames (``GET /kv/events?load=1``, binary form) is
subscribed here. ``run`` waits for the engine to say its load changed
(``AsyncEngine.load_changed``: a step changed what a router routes by, or the worker
began draining), then puts one frame of the load as it is now on every subscriber's
queue, behind the KV events already there, and sleeps ``interval_s`` before the next:
changes within that interval go out together in the next frame. ``frame`` is the load
now, for a stream that opens and for the idle heartbeat. Each report that differs
from the last gets the next ``seq``; one that does not repeats the last (a heartbeat
with nothing new). ``ready_seq`` counts the changes of ``ready_view`` (what ``/ready``
says beyond the free blocks), so a router knows when to probe ``/ready`` again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Mapping

import msgspec

from radix.events import LoadReport, load_frame
from workers.engine.async_engine import AsyncEngine
from workers.engine.kv_feed import Subscription

# A stream with this many frames waiting is behind: it gets no load frame until it
# drains (the next one carries the load as it is then).
MAX_PENDING_FRAMES = 64


class LoadPush:
    """Load frames for ``engine``'s subscribers. ``held`` gives the blocks held for
    consumers and their cap (``num_held_blocks``, ``max_held_blocks``); ``max_num_running``
    and ``max_num_requests`` are the engine's batch and admission bounds; ``ready_view``
    what ``/ready`` says beyond the free blocks (compared for equality only)."""

    def __init__(self, engine: AsyncEngine, interval_s: float, max_num_running: int,
                 max_num_requests: int, held: Callable[[], Mapping[str, int]],
                 ready_view: Callable[[], Hashable]) -> None:
        self._engine = engine
        self._interval_s = interval_s
        self._max_num_running = max_num_running
        self._max_num_requests = max_num_requests
        self._held = held
        self._ready_view = ready_view
        self._last_view: Hashable = None
        self._subscribers: set[Subscription] = set()
        self._report = LoadReport(0)
        self._frame = load_frame(self._report)

    def subscribe(self, subscription: Subscription) -> None:
        """Send ``subscription`` a frame at every load change until ``unsubscribe``."""
        self._subscribers.add(subscription)

    def unsubscribe(self, subscription: Subscription) -> None:
        """Stop sending ``subscription`` frames."""
        self._subscribers.discard(subscription)

    def frame(self) -> bytes:
        """A load frame of the load now (the last one's ``seq`` when nothing changed)."""
        stats = self._engine.stats
        held = self._held()
        view = self._ready_view()
        ready_seq = self._report.ready_seq + (view != self._last_view)
        self._last_view = view
        report = LoadReport(
            self._report.seq, stats.num_requests_running, stats.num_requests_waiting,
            stats.num_waiting_tokens, min(1.0, max(0.0, stats.kv_cache_usage_ratio)),
            self._max_num_requests, self._max_num_running,
            held["num_held_blocks"], held["max_held_blocks"], ready_seq)
        if report != self._report:
            self._report = msgspec.structs.replace(report, seq=report.seq + 1)
            self._frame = load_frame(self._report)
        return self._frame

    async def run(self) -> None:
        """Push each load change to every subscriber, at most one frame per
        ``interval_s``; until cancelled."""
        changed = self._engine.load_changed
        while True:
            await changed.wait()
            changed.clear()
            seq = self._report.seq
            data = self.frame()
            if self._report.seq != seq:
                for subscription in self._subscribers:
                    if subscription.queue.qsize() < MAX_PENDING_FRAMES:
                        subscription.queue.put_nowait(data)
            await asyncio.sleep(self._interval_s)
