"""The worker's bounded, gapless KV event log (one per worker process).

A new log starts a new ``epoch`` (uuid4 hex) with a ``cleared`` event at ``seq`` 0:
whatever a consumer knew about this worker before is void. Every later event gets
the next ``seq``. The log keeps the newest events within ``max_events`` and
``max_tokens`` (stored tokens held by the events); a consumer that fell further
behind, or knows another epoch, gets None from ``since`` and must take a snapshot.

Appends come from the engine thread; ``since`` may be called from any thread
(a lock guards the deque).
"""

from __future__ import annotations

import threading
import uuid
from collections import deque
from collections.abc import Sequence
from itertools import islice

from radix.events import EventBlock, EventType, KVEvent, Medium
from radix.keys import TOKEN_BYTES
from radix.tree import PUBLIC


class KVEventLog:
    """Append-only log of one worker epoch, bounded by event and token counts."""

    def __init__(
        self,
        worker_id: str,
        namespace_digest: bytes,
        max_events: int = 65536,
        max_tokens: int = 1 << 20,
    ):
        if not worker_id:
            raise ValueError("worker_id must not be empty")
        if max_events <= 0 or max_tokens <= 0:
            raise ValueError(
                f"max_events and max_tokens must be positive, got {max_events}, {max_tokens}"
            )
        self.worker_id = worker_id
        self.namespace = namespace_digest.hex()
        self.epoch = uuid.uuid4().hex
        self.max_events = max_events
        self.max_tokens = max_tokens
        self._events: deque[tuple[KVEvent, int]] = deque()
        self._num_tokens = 0
        self._next_seq = 0
        self._lock = threading.Lock()
        self.append("cleared", PUBLIC, ())

    @property
    def head_seq(self) -> int:
        """The ``seq`` of the newest event."""
        return self._next_seq - 1

    def append(
        self, kind: EventType, scope: str, blocks: Sequence[EventBlock], medium: Medium = "device",
        namespace: str | None = None,
    ) -> KVEvent:
        """Log one event with the next ``seq`` under ``namespace`` (hex; None: the log's
        own, the base model's); drops the oldest events past the bounds."""
        num_tokens = sum(len(block.key or b"") for block in blocks) // TOKEN_BYTES
        with self._lock:
            event = self._make(kind, scope, blocks, self._next_seq, medium, namespace)
            self._events.append((event, num_tokens))
            self._num_tokens += num_tokens
            self._next_seq += 1
            while len(self._events) > 1 and (
                len(self._events) > self.max_events or self._num_tokens > self.max_tokens
            ):
                self._num_tokens -= self._events.popleft()[1]
        return event

    def at_head(
        self, kind: EventType, scope: str, blocks: Sequence[EventBlock], medium: Medium = "device",
        namespace: str | None = None,
    ) -> KVEvent:
        """An event stamped with ``head_seq`` and not logged (snapshot lines)."""
        return self._make(kind, scope, blocks, self.head_seq, medium, namespace)

    def since(self, seq: int, epoch: str) -> list[KVEvent] | None:
        """Events with ``seq`` greater than ``seq``, or None when the consumer must take a
        snapshot: another epoch, ``seq`` older than the log keeps, or ahead of it."""
        if epoch != self.epoch:
            return None
        with self._lock:
            oldest = self._events[0][0].seq
            if seq < oldest - 1 or seq > self.head_seq:
                return None
            return [event for event, _ in islice(self._events, seq - oldest + 1, None)]

    def for_namespace(self, namespace_digest: bytes) -> NamespaceEventLog:
        """This log as another namespace's prefix cache writes to it (an adapter's):
        the same ``seq`` stream, every event carrying that namespace."""
        return NamespaceEventLog(self, namespace_digest.hex())

    def _make(
        self, kind: EventType, scope: str, blocks: Sequence[EventBlock], seq: int, medium: Medium,
        namespace: str | None,
    ) -> KVEvent:
        return KVEvent(self.worker_id, self.epoch, seq, kind, namespace or self.namespace, scope,
                       tuple(blocks), medium)


class NamespaceEventLog(KVEventLog):
    """A view of a worker's ``KVEventLog`` for one more namespace: ``append`` and
    ``at_head`` stamp that namespace and go to the shared log (one gapless ``seq`` per
    worker over all its namespaces); reads are the shared log's."""

    def __init__(self, log: KVEventLog, namespace: str) -> None:
        self._log = log
        self.worker_id = log.worker_id
        self.namespace = namespace
        self.epoch = log.epoch
        self.max_events = log.max_events
        self.max_tokens = log.max_tokens

    @property
    def head_seq(self) -> int:
        """The shared log's newest ``seq``."""
        return self._log.head_seq

    def append(
        self, kind: EventType, scope: str, blocks: Sequence[EventBlock], medium: Medium = "device",
        namespace: str | None = None,
    ) -> KVEvent:
        """Log to the shared log under this view's namespace."""
        return self._log.append(kind, scope, blocks, medium, namespace or self.namespace)

    def at_head(
        self, kind: EventType, scope: str, blocks: Sequence[EventBlock], medium: Medium = "device",
        namespace: str | None = None,
    ) -> KVEvent:
        """A snapshot line under this view's namespace."""
        return self._log.at_head(kind, scope, blocks, medium, namespace or self.namespace)

    def since(self, seq: int, epoch: str) -> list[KVEvent] | None:
        """The shared log's ``since``."""
        return self._log.since(seq, epoch)
