"""Follow one radix worker's KV event log into the router index.

``KVEventFollower.run`` is the body of one asyncio task per radix worker: it streams
``GET {url}/kv/events`` and applies each event to the ``RouterIndex``. It asks for the
binary form (``Accept: application/x-msgpack``: length-prefixed msgpack frames of
events, ``radix.events``), decoded without a Python call per token; a worker that
answers NDJSON (one JSON event a line, an empty line a heartbeat) is read as that. Ordering rules (docs/protocol.md, "Log and snapshot"):

- a ``cleared`` event starts over: the worker's entries are dropped and its ``seq``
  (H) becomes the position; ``stored`` events with that same seq are the snapshot body;
- any other event must carry the current epoch and ``seq = last + 1``.

A gap, an event of a new epoch that does not start with ``cleared``, or a line or
frame that is malformed (``EventDecodeError``) or over ``max_message_bytes`` (both
logged and counted in ``router_kv_event_decode_errors_total``) ends the stream and
reconnects *without* ``since``: the worker answers with a snapshot. A dropped connection or a silent one
(nothing, not even a heartbeat, for ``read_timeout_s``) reconnects *with*
``since=last&epoch=E``: the worker resumes, or sends a snapshot when it cannot.
Any other exception (a bug) is logged and counted
(``router_kv_event_follower_restarts_total``), and the follower starts over from a
snapshot. Reconnects back off exponentially up to ``max_backoff_s``, reset by a stream
that delivered an event. Cancelling the task closes the connection and ends ``run``.

Load: unless told not to (``registry.pushed_load`` off), the follower asks for load
frames (``?load=1``); a worker that sends them says so (``X-Load-Frames: 1``) and
each frame updates its ``LoadState`` (``router.fleet.load_state``). A stream opening
tells the ``LoadState`` whether it pushes; one that ends, for whichever reason, makes
a pushing worker's load unknown until the next frame.

Trust (``router.fleet.events.health``): the worker is routed stale from the start
and whenever a stream ends, for whichever reason it ended, and exact again at the
first heartbeat of a stream: the worker sends one right after the backlog or snapshot
it opens with, so every event before it is applied.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

import aiohttp
import msgspec

from radix.events import (
    FRAME_HEADER,
    LOAD_FRAMES_HEADER,
    LOAD_QUERY,
    MSGPACK_CONTENT_TYPE,
    EventDecodeError,
    KVEvent,
    LoadReport,
    decode_event,
    decode_frame,
)
from router.config import KVEventsConfig
from router.fleet.events.health import StreamHealth
from router.fleet.events.metrics import KVEventMetrics
from router.fleet.worker_state import WorkerState
from router.routing.index import RouterIndex, WorkerId

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FollowerStatus:
    """Where a follower stands, for ``/admin/index``."""

    worker_id: WorkerId
    connected: bool
    epoch: str | None
    last_seq: int | None
    num_events: int
    num_connects: int
    num_resyncs: int
    last_error: str | None


class _Resync(Exception):
    """The stream cannot be continued: reconnect for a snapshot."""


class _Malformed(_Resync):
    """A line or frame that does not decode, or is over ``max_message_bytes``."""


class KVEventFollower:
    """Streams ``worker``'s KV events into ``index`` under its id, and says how far
    they are trusted on ``worker`` (``StreamHealth``).

    ``metrics`` count its decode errors and restarts under the worker's id. The
    worker's ``headers`` go with every request (its ``Authorization``). When
    ``namespace_of`` is given, each event is filed under ``namespace_of(its
    namespace)``: the router's own digest of that namespace (the worker's base or one
    of its LoRA adapters'), which differs from the worker's when their secrets do.
    ``ask_load``: ask for load frames (the worker's ``load_state`` takes them).
    """

    def __init__(self, index: RouterIndex, worker: WorkerState,
                 session: aiohttp.ClientSession, metrics: KVEventMetrics,
                 namespace_of: Callable[[str], str] | None = None,
                 config: KVEventsConfig | None = None, ask_load: bool = False) -> None:
        self.index = index
        self.worker_id = WorkerId(worker.worker_id)
        self.health = StreamHealth(worker, index)
        self.load = worker.load_state
        self.ask_load = ask_load
        self.url = worker.url + "/kv/events"
        self.session = session
        self.headers: Mapping[str, str] = worker.headers
        self.namespace_of = namespace_of
        self.config = config or KVEventsConfig()
        self._epoch: str | None = None
        self._last_seq: int | None = None
        self._snapshot_seq: int | None = None
        self._resume = False
        self._connected = False
        self._num_events = self._num_connects = self._num_resyncs = 0
        self._last_error: str | None = None
        self._decode_errors = metrics.decode_errors.labels(self.worker_id)
        self._restarts = metrics.restarts.labels(self.worker_id)

    def status(self) -> FollowerStatus:
        """A snapshot of the follower's position and counters."""
        return FollowerStatus(self.worker_id, self._connected, self._epoch, self._last_seq,
                              self._num_events, self._num_connects, self._num_resyncs,
                              self._last_error)

    async def run(self) -> None:
        """Follow the log until cancelled; never returns otherwise. The worker is routed
        stale from the start until a stream catches up, after every stream that ends,
        and once cancelled."""
        self.health.started("connecting to its KV event stream")
        backoff = self.config.initial_backoff_s
        try:
            while True:
                num_before = self._num_events
                self._last_error = await self._follow_once()
                self.health.stale(f"KV event stream: {self._last_error}")
                self.load.lost()
                if self._num_events > num_before:
                    backoff = self.config.initial_backoff_s
                await asyncio.sleep(backoff)
                backoff = min(2 * backoff, self.config.max_backoff_s)
        finally:
            self.health.stopped()
            self.load.stopped()

    async def _follow_once(self) -> str:
        """Follow one stream until it ends; why it ended."""
        try:
            await self._stream()
            return "stream ended"
        except _Resync as exc:
            if isinstance(exc, _Malformed):
                self._decode_errors.inc()
            self._resume = False
            self._num_resyncs += 1
            log.warning("kv events of %s: %s; resyncing from a snapshot", self.worker_id, exc)
            return str(exc)
        except aiohttp.SocketTimeoutError:
            reason = f"no event or heartbeat for {self.config.read_timeout_s:g} s"
            log.warning("kv events of %s: %s; reconnecting", self.worker_id, reason)
            return reason
        except (aiohttp.ClientError, TimeoutError) as exc:
            reason = f"{type(exc).__name__}: {exc}"
            log.info("kv events of %s: %s; reconnecting", self.worker_id, reason)
            return reason
        except Exception as exc:  # a bug must not end following: log it, start over
            self._resume = False
            self._restarts.inc()
            log.exception("kv events of %s: unexpected error; resyncing", self.worker_id)
            return f"{type(exc).__name__}: {exc}"
        finally:
            self._connected = False

    async def _stream(self) -> None:
        params = {}
        if self._resume and self._epoch is not None and self._last_seq is not None:
            params = {"since": str(self._last_seq), "epoch": self._epoch}
        if self.ask_load:
            params[LOAD_QUERY[0]] = LOAD_QUERY[1]
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.config.connect_timeout_s,
                                        sock_read=self.config.read_timeout_s)
        headers = {**self.headers, "Accept": f"{MSGPACK_CONTENT_TYPE}, application/x-ndjson"}
        async with self.session.get(self.url, params=params, headers=headers,
                                    timeout=timeout) as resp:
            if resp.status != 200:
                raise _Resync(f"GET /kv/events answered HTTP {resp.status}")
            self._connected = True
            self._num_connects += 1
            self._resume = True
            binary = resp.content_type == MSGPACK_CONTENT_TYPE
            self.load.stream_opened(binary and resp.headers.get(LOAD_FRAMES_HEADER) == "1")
            batches = (_frames(resp.content, self.config.max_message_bytes) if binary else
                       _json_lines(resp.content, self.config.max_message_bytes))
            async for events in batches:
                self.health.heard()
                if isinstance(events, LoadReport):
                    self.load.pushed(events)
                    continue
                if not events:  # a heartbeat: everything sent before it is applied
                    self.health.rebuilt()
                for event in events:
                    self._handle(event)

    def _handle(self, event: KVEvent) -> None:
        if event.type == "cleared":
            self._epoch, self._last_seq, self._snapshot_seq = event.epoch, event.seq, event.seq
        elif event.epoch != self._epoch:
            self.index.reset_worker(self.worker_id)
            self._epoch = self._last_seq = None
            raise _Resync(f"new epoch {event.epoch!r} without a snapshot")
        elif event.type == "stored" and event.seq == self._snapshot_seq:
            pass
        elif self._last_seq is not None and event.seq == self._last_seq + 1:
            self._last_seq, self._snapshot_seq = event.seq, None
        else:
            raise _Resync(f"gap: seq {event.seq} after {self._last_seq}")
        if self.namespace_of is not None:
            namespace = self.namespace_of(event.namespace)
            if namespace != event.namespace:
                event = msgspec.structs.replace(event, namespace=namespace)
        self.index.apply_event(self.worker_id, event)
        self._num_events += 1


async def _json_lines(content: aiohttp.StreamReader, max_message_bytes: int
                      ) -> AsyncIterator[list[KVEvent]]:
    """The NDJSON stream's events, a line at a time (an empty line is a heartbeat: no
    events)."""
    async for line in _lines(content, max_message_bytes):
        if not line.strip():
            yield []
            continue
        try:
            yield [decode_event(line)]
        except EventDecodeError as exc:
            raise _Malformed(f"malformed event: {exc}") from exc


async def _frames(content: aiohttp.StreamReader, max_frame_bytes: int
                  ) -> AsyncIterator[list[KVEvent] | LoadReport]:
    """The binary stream's events, a frame at a time (``radix.events``: a 4-byte length,
    then a msgpack array of events, an empty one a heartbeat, or a map, a load
    report). A frame cut off by a disconnect is dropped: the reconnect resumes before
    it."""
    while True:
        try:
            head = await content.readexactly(FRAME_HEADER.size)
            (size,) = FRAME_HEADER.unpack(head)
            if size > max_frame_bytes:
                raise _Malformed(f"event frame of {size} bytes, over {max_frame_bytes}")
            body = await content.readexactly(size)
        except asyncio.IncompleteReadError:
            return
        try:
            yield decode_frame(body)
        except EventDecodeError as exc:
            raise _Malformed(f"malformed event: {exc}") from exc


async def _lines(content: aiohttp.StreamReader, max_message_bytes: int) -> AsyncIterator[bytes]:
    """Split a byte stream at newlines with no per-line limit below ``max_message_bytes``
    (aiohttp's ``readline`` refuses lines over its buffer; a snapshot line can be large).
    A last line cut off by a disconnect is dropped: the reconnect resumes before it."""
    buffer = bytearray()
    async for chunk in content.iter_any():
        buffer += chunk
        start = 0
        while (end := buffer.find(b"\n", start)) >= 0:
            yield bytes(buffer[start:end])
            start = end + 1
        del buffer[:start]
        if len(buffer) > max_message_bytes:
            raise _Malformed(f"event line over {max_message_bytes} bytes")
