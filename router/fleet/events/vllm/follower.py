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
  by a replay from ``last + 1``. A replay that no longer reaches ``last + 1`` clears
  the worker and applies what the buffer still has.
- **Restart:** the PUB connection dropping (a ZMQ socket monitor sees it) clears the
  worker's entries at once and discards the messages queued before it, even if the
  server then stays idle and sends nothing. A live ``seq`` at or below the previous
  live one (the server restarted between two messages) clears it too. A failed probe
  ends this task and clears the worker (``WorkerRegistry``).
- **Garbage:** a malformed message, batch or event (anything that fails to decode, a
  message nested past the decoder's depth included, or a store that would file one
  index block under two hashes) is skipped and counted by reason
  (``router_kv_event_malformed_total``); the rest of its batch applies, the worker's
  entries stay and the follower goes on. No message may pass ``MAX_MESSAGE_BYTES``
  (ZMQ drops the connection), and a replay is bounded in time (``replay_timeout_s``
  in all, not per message), in batches (``replay_batches``: the server's buffer) and
  in bytes (``replay_bytes``): past any bound it is abandoned.
- **Anything else** that ends the follower (a bug) is logged and counted
  (``router_kv_event_follower_restarts_total``); the worker's entries are cleared and
  the follower starts over.

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
from router.fleet.events.metrics import MALFORMED_REASONS, KVEventMetrics
from router.fleet.events.vllm.translate import BlockConflict, VllmTranslator
from router.fleet.events.vllm.wire import END_OF_REPLAY, WireError, decode_batch, decode_seq
from router.routing.index import WorkerId

log = logging.getLogger(__name__)
_MONITORED = zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED
_REPLAY_YIELD_EVERY = 64
MAX_MESSAGE_BYTES = 64 * 2**20
# A scheduler step of 8,192 new tokens in 16-token blocks publishes about 40 KiB; most
# steps (decode) publish far less. A replay may average this much per batch.
REPLAY_BYTES_PER_BATCH = 32 * 2**10
RESTART_DELAY_S = 1.0


def replay_bytes(replay_batches: int) -> int:
    """The most bytes a replay of ``replay_batches`` may bring: ``REPLAY_BYTES_PER_BATCH``
    each, and never less than one message of ``MAX_MESSAGE_BYTES``."""
    return max(replay_batches * REPLAY_BYTES_PER_BATCH, MAX_MESSAGE_BYTES)


class EventSink(Protocol):
    """What the follower needs of the router index (``RouterIndex`` has both)."""

    def apply_event(self, worker_id: WorkerId, event: KVEvent) -> None:
        """Apply one translated event."""

    def reset_worker(self, worker_id: WorkerId) -> None:
        """Drop everything held for the worker."""


@dataclass(frozen=True)
class Endpoints:
    """A vLLM server's ``endpoint`` (its PUB socket) and ``replay_endpoint`` (its
    ROUTER socket; None when it has none: gaps then clear the worker), and how many
    batches its replay buffer holds (``buffer_steps``)."""

    events: str
    replay: str | None
    replay_timeout_s: float = 10.0
    replay_batches: int = VLLM_REPLAY_BATCHES


class VllmEventFollower:
    """Streams one vLLM server's KV events into ``sink`` under ``translator``'s worker."""

    def __init__(self, sink: EventSink, translator: VllmTranslator, endpoints: Endpoints,
                 metrics: KVEventMetrics, context: zmq.asyncio.Context) -> None:
        self._sink = sink
        self._translator = translator
        self._worker_id = WorkerId(translator.worker_id)
        self._endpoints = endpoints
        self._context = context
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
        while True:
            try:
                await self._follow()
            except Exception:  # a bug must not freeze this worker's index
                log.exception("kv events of %s: the follower failed; starting over",
                              self._worker_id)
                self._restarts.inc()
                self._clear("the follower started over")
                await asyncio.sleep(RESTART_DELAY_S)

    async def _follow(self) -> None:
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
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
        try:
            seq = decode_seq(frames[-2]) if len(frames) >= 2 else -1
        except WireError:
            seq = -1
        if seq < 0:
            self._skip("message")
            return
        if self._last_live_seq is not None and seq <= self._last_live_seq:
            self._clear(f"seq went back from {self._last_live_seq} to {seq} (a restart)")
        self._last_live_seq = seq
        if not self._synced:
            await self._sync()
        if self._last_seq is not None and seq > self._last_seq + 1:
            self._gaps.inc()
            await self._fill(self._last_seq + 1)
            if self._last_seq is not None and seq > self._last_seq + 1:
                self._clear(f"gap before seq {seq} that no replay covers")
                self._synced = True  # from here on, what comes live is the whole truth
        if self._last_seq is None or seq == self._last_seq + 1:
            self._apply(seq, frames[-1], live=True)

    async def _sync(self) -> None:
        """Catch up from seq 0 (after a start or a clear)."""
        self._synced = True
        batches = await self._replay(0)
        if batches:
            self._resyncs.inc()
            await self._apply_all(batches)

    async def _fill(self, start: int) -> None:
        """Replay from ``start``; a buffer that no longer reaches it clears the worker
        and applies what it has."""
        batches = await self._replay(start)
        if batches is None:
            return
        if not batches or batches[0][0] != start:
            self._clear(f"replay buffer no longer holds seq {start}")
            self._synced = True
        await self._apply_all(batches)

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
        self._sink.reset_worker(self._worker_id)
        self._translator.reset()
        self._resyncs.inc()
        self._last_seq = self._last_live_seq = None
        self._synced = False

    async def _replay(self, start: int) -> list[tuple[int, bytes]] | None:
        """The buffered batches from ``start`` on, or None without a replay endpoint or
        when the server does not finish answering within ``replay_timeout_s`` (in all),
        ``replay_batches`` batches and ``replay_bytes`` of them."""
        if self._endpoints.replay is None:
            return None
        max_batches = self._endpoints.replay_batches
        max_bytes = replay_bytes(max_batches)
        self._replays.inc()
        dealer = self._context.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        dealer.connect(self._endpoints.replay)
        deadline = time.monotonic() + self._endpoints.replay_timeout_s
        batches: list[tuple[int, bytes]] = []
        num_bytes = 0
        try:
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while (left_ms := int((deadline - time.monotonic()) * 1000)) > 0 \
                    and await dealer.poll(left_ms):
                frames = await dealer.recv_multipart()
                if len(frames) < 3 or frames[-2] == END_OF_REPLAY:
                    return batches
                num_bytes += sum(len(frame) for frame in frames)
                if num_bytes > max_bytes or len(batches) >= max_batches:
                    log.warning("kv events of %s: replay from %d over %d bytes or %d batches; "
                                "abandoned", self._worker_id, start, max_bytes, max_batches)
                    return None
                try:
                    batches.append((decode_seq(frames[-2]), frames[-1]))
                except WireError:
                    self._skip("message")
            log.warning("kv events of %s: replay from %d timed out", self._worker_id, start)
            return None
        finally:
            dealer.close(linger=0)


def _recv_now(sock: zmq.Socket) -> list[bytes] | None:
    """One message if one is queued, else None (never waits)."""
    try:
        return sock.recv_multipart(zmq.NOBLOCK)
    except zmq.Again:
        return None
