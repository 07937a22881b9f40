"""Fan-out of the worker's KV event log to ``GET /kv/events`` subscribers.

The engine thread (which alone mutates the prefix cache) calls ``publish()`` after
each step; new events are encoded once and posted to the event loop, which puts
them on every subscriber's queue. A subscriber opens on the engine thread too
(``open``: the backlog from the log, or a snapshot), and its registration is posted
to the loop before any later publication, so a subscriber sees every event after
its backlog exactly once: events at or below its starting ``seq`` are skipped.

A subscriber reads one ``EventFormat``: NDJSON (for people and older routers) or the
binary frames of ``radix.events`` (what routers ask for); each batch is encoded once
per format in use. A subscriber that falls more than ``max_pending`` batches behind is
dropped (``lost``); its consumer reconnects and resyncs from the log or a snapshot.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import NamedTuple

from radix.events import (
    HEARTBEAT_FRAME,
    MSGPACK_CONTENT_TYPE,
    KVEvent,
    encode_event,
    encode_msgpack,
    frame,
)
from workers.kv.manager import KVCacheManager

MAX_FRAME_EVENTS = 1024


class EventFormat(NamedTuple):
    """How a stream writes events: one event's encoding, the bytes of a batch of
    encoded events, and the heartbeat sent when nothing happens."""

    content_type: str
    encode: Callable[[KVEvent], bytes]
    batch: Callable[[Sequence[bytes]], bytes]
    heartbeat: bytes


def _frames(encoded: Sequence[bytes]) -> bytes:
    return b"".join(frame(encoded[i: i + MAX_FRAME_EVENTS])
                    for i in range(0, len(encoded), MAX_FRAME_EVENTS))


NDJSON = EventFormat("application/x-ndjson", lambda e: encode_event(e).encode() + b"\n",
                     b"".join, b"\n")
BINARY = EventFormat(MSGPACK_CONTENT_TYPE, encode_msgpack, _frames, HEARTBEAT_FRAME)


class Subscription:
    """One consumer: its backlog (already encoded in ``form``), then live batches from
    ``queue``. ``lost`` becomes True when it fell too far behind; the stream must then
    end."""

    def __init__(self, backlog: bytes, after_seq: int, form: EventFormat) -> None:
        self.backlog = backlog
        self.after_seq = after_seq
        self.form = form
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
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
            self._post(self._fan_out, events)

    def open(self, since: int | None, epoch: str | None, form: EventFormat = NDJSON
             ) -> Subscription:
        """A subscription in ``form`` starting after ``since`` of ``epoch`` if the log
        still holds that point, else at a snapshot. Engine thread only
        (``AsyncEngine.call``)."""
        log = self._manager.event_log
        events = None if since is None or epoch is None else log.since(since, epoch)
        if events is None:
            head, snapshot = self._manager.snapshot()
            subscription = Subscription(form.batch([form.encode(e) for e in snapshot]), head,
                                        form)
        else:
            subscription = Subscription(form.batch([form.encode(e) for e in events]),
                                        log.head_seq, form)
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

    def _fan_out(self, events: Sequence[KVEvent]) -> None:
        encoded: dict[EventFormat, list[bytes]] = {}
        for subscription in list(self._subscribers):
            form = subscription.form
            if form not in encoded:
                encoded[form] = [form.encode(event) for event in events]
            fresh = [data for event, data in zip(events, encoded[form], strict=True)
                     if event.seq > subscription.after_seq]
            if not fresh:
                continue
            if subscription.queue.qsize() >= self._max_pending:
                self._lose(subscription)
            else:
                subscription.queue.put_nowait(form.batch(fresh))

    def drop_all(self) -> None:
        """End every subscription (log overrun, or shutdown); consumers reconnect."""
        for subscription in list(self._subscribers):
            self._lose(subscription)

    def _lose(self, subscription: Subscription) -> None:
        subscription.lost = True
        self._subscribers.discard(subscription)
        subscription.queue.put_nowait(b"")
