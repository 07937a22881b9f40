"""Fan-out of the worker's KV event log to ``GET /kv/events`` subscribers.

The engine thread (which alone mutates the prefix cache) calls ``publish()`` after
each step; new events are encoded once and posted to the event loop, which puts
them on every subscriber's queue. A subscriber opens on the engine thread too
(``open``: the backlog from the log, or a snapshot), and its registration is posted
to the loop before any later publication, so a subscriber sees every event after
its backlog exactly once: events at or below its starting ``seq`` are skipped.

A subscriber that falls more than ``max_pending`` batches behind is dropped
(``lost``); its consumer reconnects and resyncs from the log or a snapshot.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from radix.events import KVEvent, encode_event
from workers.kv.manager import KVCacheManager

Line = bytes


class Subscription:
    """One consumer: its backlog lines, then live lines from ``queue``.

    ``lost`` becomes True when it fell too far behind; the stream must then end.
    """

    def __init__(self, backlog: list[Line], after_seq: int) -> None:
        self.backlog = backlog
        self.after_seq = after_seq
        self.queue: asyncio.Queue[list[Line]] = asyncio.Queue()
        self.lost = False


class KVEventFeed:
    """Publishes ``manager``'s new KV events to subscribers on the event loop."""

    def __init__(self, manager: KVCacheManager, max_pending: int = 4096) -> None:
        self._manager = manager
        self._max_pending = max_pending
        self._published_seq = manager.event_log.head_seq
        self._subscribers: set[Subscription] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop that subscribers live on (set before the engine thread starts)."""
        self._loop = loop

    # ---- engine thread -------------------------------------------------------------

    def publish(self) -> None:
        """Post events logged since the last call to the loop."""
        log = self._manager.event_log
        if log.head_seq == self._published_seq:
            return
        events = log.since(self._published_seq, log.epoch)
        self._published_seq = log.head_seq
        if events is None:
            self._post(self.drop_all)
        else:
            self._post(self._fan_out, [(event.seq, _line(event)) for event in events])

    def open(self, since: int | None, epoch: str | None) -> Subscription:
        """A subscription starting after ``since`` of ``epoch`` if the log still holds
        that point, else at a snapshot. Engine thread only (``AsyncEngine.call``)."""
        log = self._manager.event_log
        events = None if since is None or epoch is None else log.since(since, epoch)
        if events is None:
            head, snapshot = self._manager.snapshot()
            subscription = Subscription([_line(e) for e in snapshot], head)
        else:
            subscription = Subscription([_line(e) for e in events], log.head_seq)
        self._post(self._subscribers.add, subscription)
        return subscription

    def _post(self, fn: Callable[..., None], *args: object) -> None:
        assert self._loop is not None, "bind() first"
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # loop closed at shutdown
            return

    # ---- loop thread ---------------------------------------------------------------

    def close(self, subscription: Subscription) -> None:
        """Stop feeding ``subscription``."""
        self._subscribers.discard(subscription)

    def _fan_out(self, items: list[tuple[int, Line]]) -> None:
        for subscription in list(self._subscribers):
            lines = [line for seq, line in items if seq > subscription.after_seq]
            if not lines:
                continue
            if subscription.queue.qsize() >= self._max_pending:
                self._lose(subscription)
            else:
                subscription.queue.put_nowait(lines)

    def drop_all(self) -> None:
        """End every subscription (log overrun, or shutdown); consumers reconnect."""
        for subscription in list(self._subscribers):
            self._lose(subscription)

    def _lose(self, subscription: Subscription) -> None:
        subscription.lost = True
        self._subscribers.discard(subscription)
        subscription.queue.put_nowait([])


def _line(event: KVEvent) -> Line:
    return encode_event(event).encode() + b"\n"
