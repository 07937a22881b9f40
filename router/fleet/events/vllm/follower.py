"""Follow one vLLM server's KV events (ZMQ) into the router index.

vLLM publishes on a PUB socket and answers replays on a ROUTER socket
(``router.fleet.events.vllm.wire``); it has no epoch and no snapshot: a restarted server
starts ``seq`` at 0 with an empty cache. The rules, so that the index never claims a
block the server may not hold:

- **Start, or after a clear:** replay from seq 0. vLLM keeps its last batches (10,000
  by default); a replay that starts at 0 is the whole history, a later start is the
  tail, and the index then holds the subset it can prove (a block whose store fell
  out of the buffer is not claimed; its chain's later blocks are orphans, skipped).
- **Live:** a batch at ``last + 1`` is applied; at or below ``last`` it is a
  duplicate (the replay already applied it) and skipped; above it is a gap, filled
  by a replay from ``last + 1`` (``router.fleet.events.vllm.sequence``). A replay
  that no longer reaches ``last + 1``, or none (no replay endpoint, or one that
  fails), clears the worker and applies what the buffer still has: replay before
  clear. A replay that covers the gap but ends before the live batch's seq shows that
  seq was garbage: the message is skipped as malformed and nothing is cleared.
- **Restart:** the PUB connection dropping (a ZMQ socket monitor sees it) clears the
  worker's entries at once and discards the messages queued before it, even if the
  server then stays idle and sends nothing. A live ``seq`` at or below the previous
  live one is a restart between two messages (the worker is cleared and replayed from
  0) unless a replay from it shows the server's buffer still reaching the previous
  one: then the seq was garbage, skipped. Without a replay endpoint it is a restart.
  A failed probe ends this task and clears the worker (``WorkerRegistry``).
- **Silence:** vLLM publishes nothing while idle, so quiet is no fault; but the
  subscription pings the server (ZMTP heartbeats, every half of ``read_timeout_s``)
  and drops a connection that does not answer within the other half: a dead or
  unreachable server is a dropped connection, as above.
- **Garbage:** a malformed message, batch or event (anything that fails to decode, a
  message nested past the decoder's depth included, or a store that would file one
  index block under two hashes) is skipped and counted by reason
  (``router_kv_event_malformed_total``); the rest of its batch applies, the worker's
  entries stay and the follower goes on. A message whose seq cannot be read shows as
  a gap at the next one, which a replay fills; a payload that does not decode is not
  asked again (the server buffers the very bytes it sent). No message may pass
  ``MAX_MESSAGE_BYTES`` (ZMQ drops the connection); a replay is bounded
  (``router.fleet.events.vllm.replay``).
- **Anything else** that ends the follower (a bug) is logged and counted
  (``router_kv_event_follower_restarts_total``); the worker's entries are cleared and
  the follower starts over.

Trust (``router.fleet.events.health``): the worker is routed stale from the start
until the first replay from 0, from a gap until its replay (or the clear) is applied,
and from a dropped connection until it is back and replayed; when that replay fails,
until its first live batch. vLLM has no snapshot: a cleared worker is rebuilt from
what the replay buffer still holds and what comes live after, a subset of its cache
that never claims a block it may not hold.

Cancelling the task closes its sockets.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from radix.events import KVEvent
from router.config import VLLM_REPLAY_BATCHES
from router.fleet.events.health import StreamHealth
from router.fleet.events.metrics import MALFORMED_REASONS, KVEventMetrics
from router.fleet.events.vllm.replay import MAX_MESSAGE_BYTES, ReplayFailed, request_replay
from router.fleet.events.vllm.sequence import (
    LiveStep,
    Replayed,
    gap_replayed,
    live_step,
    restarted,
)
from router.fleet.events.vllm.translate import BlockConflict, VllmTranslator
from router.fleet.events.vllm.wire import WireError, decode_batch, decode_seq
from router.routing.index import WorkerId

log = logging.getLogger(__name__)
_MONITORED = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
_REPLAY_YIELD_EVERY = 64
RESTART_DELAY_S = 1.0


class EventSink(Protocol):
    """What the follower needs of the router index (``RouterIndex`` has both)."""

    def apply_event(self, worker_id: WorkerId, event: KVEvent) -> None:
        """Apply one translated event."""

    def reset_worker(self, worker_id: WorkerId) -> None:
        """Drop everything held for the worker."""


@dataclass(frozen=True)
class Endpoints:
    """A vLLM server's ``endpoint`` (its PUB socket) and ``replay_endpoint`` (its
    ROUTER socket; None when it has none: gaps then clear the worker), how many
    batches its replay buffer holds (``buffer_steps``), and how long its connection
    may leave a ping unanswered, in all (``kv_events.read_timeout_s``)."""

    events: str
    replay: str | None
    replay_timeout_s: float = 10.0
    replay_batches: int = VLLM_REPLAY_BATCHES
    read_timeout_s: float = 15.0


class VllmEventFollower:
    """Streams one vLLM server's KV events into ``sink`` under ``translator``'s worker,
    and says how far they are trusted (``health``)."""

    def __init__(self, sink: EventSink, translator: VllmTranslator, endpoints: Endpoints,
                 metrics: KVEventMetrics, context: zmq.asyncio.Context,
                 health: StreamHealth) -> None:
        self._sink = sink
        self._translator = translator
        self._worker_id = WorkerId(translator.worker_id)
        self._endpoints = endpoints
        self._context = context
        self._health = health
        self._last_seq: int | None = None
        self._last_live_seq: int | None = None
        self._synced = False
        self._events = metrics.events.labels(self._worker_id)
        self._gaps = metrics.gaps.labels(self._worker_id)
        self._replays = metrics.replays.labels(self._worker_id)
        self._resyncs = metrics.resyncs.labels(self._worker_id)
        self._decode_errors = metrics.decode_errors.labels(self._worker_id)
        self._malformed = {reason: metrics.malformed.labels(self._worker_id, reason)
                           for reason in MALFORMED_REASONS}
        self._restarts = metrics.restarts.labels(self._worker_id)
        self._lag = metrics.lag

    @property
    def last_seq(self) -> int | None:
        """The last sequence number applied (None: nothing since the last clear)."""
        return self._last_seq

    async def run(self) -> None:
        """Follow until cancelled, starting over after anything that ends a run."""
        self._health.started("connecting to its KV event publisher")
        try:
            while True:
                try:
                    await self._follow()
                except Exception:  # a bug must not freeze this worker's index
                    log.exception("kv events of %s: the follower failed; starting over",
                                  self._worker_id)
                    self._restarts.inc()
                    self._clear("the follower started over")
                    await asyncio.sleep(RESTART_DELAY_S)
        finally:
            self._health.stopped()

    async def _follow(self) -> None:
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        ping_ms = max(int(self._endpoints.read_timeout_s * 500), 1)
        sub.setsockopt(zmq.HEARTBEAT_IVL, ping_ms)
        sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, ping_ms)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        monitor = sub.get_monitor_socket(_MONITORED)
        sub.connect(self._endpoints.events)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        queued = zmq.Socket.shadow(sub.underlying)
        try:
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:
                    await self._on_monitor(await monitor.recv_multipart(), queued)
                if sub in ready and (frames := _recv_now(queued)) is not None:
                    await self._on_live(frames)
        finally:
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def _on_monitor(self, frames: list[bytes], queued: zmq.Socket) -> None:
        event = parse_monitor_message(frames)["event"]
        if event == zmq.EVENT_DISCONNECTED:
            self._clear("event connection dropped (the server may have restarted)")
            while _recv_now(queued) is not None:
                pass  # sent before the drop: the replay after reconnecting supersedes them
        elif event == zmq.EVENT_CONNECTED and not self._synced:
            await self._sync()

    async def _on_live(self, frames: Sequence[bytes]) -> None:
        self._health.heard()
        try:
            seq = decode_seq(frames[-2]) if len(frames) >= 2 else None
        except WireError:
            seq = None
        if seq is None or not await self._catch_up(seq):
            self._skip("message")
            return
        self._last_live_seq = seq
        if self._last_seq is None or seq == self._last_seq + 1:
            self._apply(seq, frames[-1], live=True)
        self._health.rebuilt()  # the index holds every batch up to this live one

    async def _catch_up(self, seq: int) -> bool:
        """Bring the index up to live ``seq`` (a sync from 0 after a start or a clear, a
        replay over a gap, a clear after a restart); False when ``seq`` is one the
        server never published (garbage, to skip)."""
        step = live_step(seq, self._last_seq, self._last_live_seq)
        if step is LiveStep.WENT_BACK:
            assert self._last_live_seq is not None
            replay = await self._replay(seq)
            if not restarted(self._last_live_seq, _seqs(replay)):
                return False
            self._clear(f"seq went back from {self._last_live_seq} to {seq} (a restart)")
        if not self._synced:
            await self._sync()
        elif step is LiveStep.GAP:
            return await self._fill_gap(seq)
        return True

    async def _sync(self) -> None:
        """Catch up from seq 0 (after a start or a clear). The worker is rebuilt then,
        unless the replay failed: then at its first live batch."""
        self._synced = True
        batches = await self._replay(0)
        if batches:
            self._resyncs.inc()
            await self._apply_all(batches)
        if batches is not None or self._endpoints.replay is None:
            self._health.rebuilt()

    async def _fill_gap(self, seq: int) -> bool:
        """Replay what was missed before live ``seq``; a buffer that no longer reaches
        it, or no replay, clears the worker and applies what the buffer has. False when
        the replay shows ``seq`` was never published."""
        assert self._last_seq is not None
        start = self._last_seq + 1
        self._gaps.inc()
        self._health.stale(f"KV events missed: seq {seq} after {start - 1}; replaying")
        batches = await self._replay(start)
        outcome = gap_replayed(start, seq, _seqs(batches))
        if outcome is Replayed.LOST:
            self._clear(f"gap before seq {seq} that no replay covers")
            self._synced = True  # from here on, what comes live is the whole truth
        await self._apply_all(batches or [])
        self._health.rebuilt()
        return outcome is not Replayed.UNPUBLISHED

    async def _apply_all(self, batches: list[tuple[int, bytes]]) -> None:
        for i, (seq, payload) in enumerate(batches):
            if self._last_seq is None or seq == self._last_seq + 1:
                self._apply(seq, payload, live=False)
            if i % _REPLAY_YIELD_EVERY == _REPLAY_YIELD_EVERY - 1:
                await asyncio.sleep(0)

    def _apply(self, seq: int, payload: bytes, live: bool) -> None:
        self._last_seq = seq
        try:
            batch = decode_batch(seq, payload)
        except Exception as exc:  # RecursionError, MemoryError on garbage, not only WireError
            self._skip("payload")
            log.warning("kv events of %s: seq %d skipped: %s: %s", self._worker_id, seq,
                        type(exc).__name__, exc)
            return
        if batch.num_malformed:
            self._skip("event", batch.num_malformed)
        for event in batch.events:
            try:
                translated = self._translator.translate(seq, event)
            except BlockConflict as exc:
                self._malformed["conflict"].inc()
                log.warning("kv events of %s: an event of seq %d skipped: %s",
                            self._worker_id, seq, exc)
                continue
            for index_event in translated:
                self._sink.apply_event(self._worker_id, index_event)
        self._events.inc()
        if live:
            self._lag.observe(max(time.time() - batch.ts, 0.0))

    def _skip(self, reason: str, num: int = 1) -> None:
        """Count ``num`` undecodable items (``reason`` in ``MALFORMED_REASONS``)."""
        self._malformed[reason].inc(num)
        self._decode_errors.inc(num)

    def _clear(self, reason: str) -> None:
        log.warning("kv events of %s: %s; clearing its index entries", self._worker_id, reason)
        self._health.stale(reason)
        self._sink.reset_worker(self._worker_id)
        self._translator.reset()
        self._resyncs.inc()
        self._last_seq = self._last_live_seq = None
        self._synced = False

    async def _replay(self, start: int) -> list[tuple[int, bytes]] | None:
        """The buffered batches from ``start`` on (messages that do not decode counted
        and left out), or None without a replay endpoint or when the replay fails
        (``request_replay``)."""
        if self._endpoints.replay is None:
            return None
        self._replays.inc()
        try:
            replay = await request_replay(self._context, self._endpoints.replay, start,
                                          self._endpoints.replay_timeout_s,
                                          self._endpoints.replay_batches)
        except ReplayFailed as exc:
            log.warning("kv events of %s: replay from %d abandoned: %s", self._worker_id,
                        start, exc)
            return None
        if replay.num_malformed:
            self._skip("message", replay.num_malformed)
        return replay.batches


def _seqs(batches: list[tuple[int, bytes]] | None) -> list[int] | None:
    """The seqs of replayed ``batches`` (None stays None: no replay)."""
    return None if batches is None else [seq for seq, _ in batches]


def _recv_now(sock: zmq.Socket) -> list[bytes] | None:
    """One message if one is queued, else None (never waits)."""
    try:
        return sock.recv_multipart(zmq.NOBLOCK)
    except zmq.Again:
        return None
