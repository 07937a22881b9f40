"""Approximate-mode inserts on a Redis Stream: every router learns the others' routes.

An ``openai`` worker publishes no KV events, so a router knows only what it routed
there itself. ``RoutedStream`` appends each of this router's decisions for such
workers to one stream, batched by a publisher task so no request waits on Redis, and
a follower task reads every entry of the other routers into the local index as if
this router had routed it. A router that joins starts ``approximate_ttl_s`` back in
the stream (stream ids are Redis times), so it loads what is still alive in the
others' indexes. Losing entries (outage, full outbox) only costs locality: the
outbox is bounded and dropped while down.

The stream is bounded in bytes, not only in entries: each entry's key is cut to
what the index keeps of it (``RouterIndex.kept_key``: the worker's approximate
capacity in tokens) and to ``stream_entry_max_tokens`` (the other routers learn the
first 8,192 tokens of a longer prompt by default: where most shared prefixes end),
every batch trims by count (``MAXLEN ~ stream_maxlen``) and by age (``XTRIM MINID``:
entries older than ``approximate_ttl_s``, dead in every index, go). So it holds at
most ``stream_maxlen`` entries of at most ``stream_entry_max_tokens`` tokens each,
all younger than ``approximate_ttl_s``: about 330 MB at the defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque

from radix.keys import TOKEN_BYTES
from router.fleet.registry import WorkerRegistry, WorkerState
from router.routing.index import NamespaceDigest, RouterIndex, WorkerId
from router.state.redis_state.link import RedisLink, RedisUnavailable
from router.tasks import cancel_and_wait

log = logging.getLogger(__name__)
_OUTBOX_SIZE = 10_000
_READ_COUNT = 1_000
_IDLE_POLL_S = 0.05


class RoutedStream:
    """Publishes and follows the routing decisions of approximate workers."""

    def __init__(self, link: RedisLink, registry: WorkerRegistry, index: RouterIndex) -> None:
        self._link = link
        self._registry = registry
        self._index = index
        self._outbox: deque[tuple[str, str, str, bytes]] = deque(maxlen=_OUTBOX_SIZE)
        self._wake = asyncio.Event()
        self._last_id: str | None = None
        self._redis_clock_offset_ms = 0
        self._tasks: list[asyncio.Task[None]] = []
        link.on_resync(self._join)

    def start(self) -> None:
        """Start the publisher and follower tasks."""
        self._tasks = [asyncio.create_task(self._publish(), name="routed stream publisher"),
                       asyncio.create_task(self._follow(), name="routed stream follower")]

    async def close(self) -> None:
        """Stop both tasks."""
        for task in self._tasks:
            await cancel_and_wait(task)

    def note(self, worker: WorkerState, key: bytes, scope: str) -> None:
        """Queue a decision for ``worker`` if it is approximate and Redis is up."""
        if worker.capabilities.routed_approximately and worker.namespace is not None and self._link.up:
            kept = self._index.kept_key(worker.worker_id, key)
            self._outbox.append((worker.namespace, worker.worker_id, scope,
                                 kept[: self._link.config.stream_entry_max_tokens * TOKEN_BYTES]))
            self._wake.set()

    async def _join(self) -> None:
        """Resync hook: learn Redis's clock (stream ids are its times); the first time,
        start reading ``approximate_ttl_s`` back."""
        seconds, micros = await self._link.call(lambda client: client.time())
        now_ms = seconds * 1000 + micros // 1000
        self._redis_clock_offset_ms = now_ms - int(time.time() * 1000)
        if self._last_id is None:
            self._last_id = f"{self._oldest_live_ms(now_ms)}-0"

    def _oldest_live_ms(self, redis_now_ms: int) -> int:
        """The Redis time before which every entry has expired in every index."""
        return max(0, redis_now_ms - int(self._index.config.approximate_ttl_s * 1000))

    async def _publish(self) -> None:
        stream, maxlen = self._link.keys.routed, self._link.config.stream_maxlen
        router_id = self._link.router_id
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch = list(self._outbox)
            self._outbox.clear()

            async def send(client, batch=batch) -> None:
                async with client.pipeline(transaction=False) as pipe:
                    for namespace, worker_id, scope, key in batch:
                        pipe.xadd(stream, {"r": router_id, "n": namespace, "w": worker_id,
                                           "s": scope, "k": key},
                                  maxlen=maxlen, approximate=True)
                    redis_now_ms = int(time.time() * 1000) + self._redis_clock_offset_ms
                    pipe.xtrim(stream, minid=f"{self._oldest_live_ms(redis_now_ms)}-0",
                               approximate=False)
                    await pipe.execute()

            with contextlib.suppress(RedisUnavailable):
                await self._link.call(send)

    async def _follow(self) -> None:
        stream, me = self._link.keys.routed, self._link.router_id.encode()
        while True:
            if not self._link.up or self._last_id is None:
                await asyncio.sleep(self._link.config.sync_interval_s)
                continue
            try:
                last_id = self._last_id
                found = await self._link.call(
                    lambda client, last_id=last_id: client.xread({stream: last_id},
                                                                 count=_READ_COUNT))
            except RedisUnavailable:
                continue
            except Exception:  # a bug must not end following
                log.exception("reading the routed stream failed")
                await asyncio.sleep(self._link.config.sync_interval_s)
                continue
            entries = found[0][1] if found else []
            for entry_id, fields in entries:
                self._last_id = entry_id.decode()
                if fields.get(b"r") != me:
                    self._apply(fields)
            if len(entries) < _READ_COUNT:
                await asyncio.sleep(_IDLE_POLL_S)

    def _apply(self, fields: dict[bytes, bytes]) -> None:
        """Note one entry of another router; an entry anyone could have written to
        Redis (missing fields, bad UTF-8, a key not whole tokens) is skipped."""
        try:
            worker_id = fields[b"w"].decode()
            namespace, scope, key = fields[b"n"].decode(), fields[b"s"].decode(), fields[b"k"]
        except (KeyError, UnicodeDecodeError):
            key = b"?"
        if len(key) % TOKEN_BYTES:
            log.warning("skipping a malformed routed-stream entry")
            return
        worker = self._registry.get(worker_id)
        if (worker is not None and worker.capabilities.routed_approximately
                and worker.namespace == namespace):
            self._index.note_routed(NamespaceDigest(namespace), WorkerId(worker_id), key, scope)
