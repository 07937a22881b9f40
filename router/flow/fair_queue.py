"""``FairQueue``: requests waiting in the router, in the order fairness allows them out.

Bands are served in strict order (band 0 first). Within a band, flows (a fairness
id: the tenant, or a session within it) share by weighted tokens with start-time
fair queueing: a request of ``cost`` tokens from a flow of weight ``w`` gets the
start tag ``S = max(V, F_flow)`` and moves the flow's finish tag to
``F_flow = S + cost / w``; the band serves the smallest start tag next and its
virtual time ``V`` becomes that tag. A flow that sent nothing for a while starts at
``V``: idle time banks no credit. Within a flow, requests keep their order.

Other routers' service (``served_elsewhere``: weighted tokens other router processes
dispatched per flow over their recent window, ``router.flow.shares``) lifts a flow's
start tag to at least ``V + served_elsewhere[flow]``: a flow another router already
serves waits here behind those it serves less, as if this queue had served it, so
shares hold across routers. Only differences between flows matter (every tag is
relative to ``V``), and it stays work-conserving: a flow alone still goes at once.

Aging keeps a lower band from starving: a band whose oldest request has waited
``aging_s`` is promoted one level for each ``aging_s`` that request has waited, and
goes before the bands native to that level (the band whose oldest waited longest
first). A band is promoted whole and keeps its fair order: aging lets it pass the
bands above, never lets one flow's old requests pass another flow's new ones in the
same band (promoting requests one by one did, and under overload, when every queued
request is old, that turned the band into one FIFO that a flood filled). The queue
holds no clock: callers pass ``now``.

Data structure only: it returns entries; the flow controller decides which of the
first few may go (``in_order``) and acts on them.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")
_SLACK = 64  # removed entries a heap may carry before it is rebuilt
_NOWHERE: Mapping[str, float] = {}


@dataclass(eq=False)
class Entry(Generic[T]):
    """One queued request: its ``item``, band, flow, token ``cost``, arrival time and
    start/finish tags (set by ``FairQueue.push``)."""

    item: T
    band: int
    flow: str
    cost: float
    enqueued_at: float
    start: float = 0.0
    finish: float = 0.0
    order: int = 0
    queued: bool = field(default=True, repr=False)


class _Band(Generic[T]):
    """One band: its virtual time, each flow's finish tag, a heap by start tag and one
    by arrival."""

    def __init__(self) -> None:
        self.virtual_time = 0.0
        self.finish_tags: dict[str, float] = {}
        self.heap: list[tuple[float, int, Entry[T]]] = []
        self.arrivals: list[tuple[float, int, Entry[T]]] = []
        self.num_queued = 0

    def oldest(self) -> Entry[T] | None:
        """The queued entry that arrived first (None when none is queued)."""
        while self.arrivals and not self.arrivals[0][2].queued:
            heapq.heappop(self.arrivals)
        return self.arrivals[0][2] if self.arrivals else None


class FairQueue(Generic[T]):
    """Bands of weighted fair queues (see the module docstring). ``weights`` map a flow
    to its weight (default 1.0); ``aging_s`` None turns promotion off."""

    def __init__(self, num_bands: int, aging_s: float | None) -> None:
        if num_bands < 1:
            raise ValueError("a fair queue needs at least one band")
        self._bands = [_Band[T]() for _ in range(num_bands)]
        self._aging_s = aging_s
        self._order = itertools.count()

    def __len__(self) -> int:
        return sum(b.num_queued for b in self._bands)

    def num_queued(self, band: int) -> int:
        """Requests waiting in ``band``."""
        return self._bands[band].num_queued

    def push(self, item: T, band: int, flow: str, cost: float, weight: float,
             now: float, served_elsewhere: Mapping[str, float] = _NOWHERE) -> Entry[T]:
        """Queue ``item`` of ``cost`` tokens for ``flow`` (of ``weight`` > 0) in
        ``band``, behind what ``served_elsewhere`` says other routers gave it; returns
        its entry (to pass to ``remove``)."""
        b = self._bands[band]
        start = max(b.virtual_time + served_elsewhere.get(flow, 0.0),
                    b.finish_tags.get(flow, 0.0))
        entry = Entry(item, band, flow, cost, now, start, start + cost / weight,
                      next(self._order))
        b.finish_tags[flow] = entry.finish
        b.num_queued += 1
        heapq.heappush(b.heap, (entry.start, entry.order, entry))
        heapq.heappush(b.arrivals, (entry.enqueued_at, entry.order, entry))
        return entry

    def remove(self, entry: Entry[T], dispatched: bool) -> None:
        """Take ``entry`` out (dispatched, or given up: cancelled or expired). A
        dispatched entry moves its band's virtual time to its start tag; one given up
        hands its flow's finish tag back when it was the flow's last. Idempotent."""
        if not entry.queued:
            return
        entry.queued = False
        b = self._bands[entry.band]
        b.num_queued -= 1
        if dispatched:
            b.virtual_time = max(b.virtual_time, entry.start)
        elif b.finish_tags.get(entry.flow) == entry.finish:
            b.finish_tags[entry.flow] = entry.start
        for heap in (b.heap, b.arrivals):
            while heap and not heap[0][2].queued:
                heapq.heappop(heap)
            if len(heap) > 2 * b.num_queued + _SLACK:
                heap[:] = [e for e in heap if e[2].queued]
                heapq.heapify(heap)
        if b.num_queued == 0:
            b.heap.clear()
            b.arrivals.clear()
            b.finish_tags = {f: t for f, t in b.finish_tags.items() if t > b.virtual_time}

    def in_order(self, now: float) -> Iterator[Entry[T]]:
        """Queued entries in the order fairness serves them: band by band, each band at
        the level aging lifted it to (the promoted before the native, the longest
        waiting first), and within a band by start tag. Lazy: a caller that takes the
        first few pays for those few."""
        queued = [i for i, b in enumerate(self._bands) if b.num_queued]
        for index in sorted(queued, key=lambda i: self._rank(i, now)):
            for _, _, entry in _heap_in_order(self._bands[index].heap):
                if entry.queued:
                    yield entry

    def _rank(self, index: int, now: float) -> tuple[int, int, float, int]:
        """Where band ``index`` goes: (its level, 0 if promoted else 1, its oldest's
        arrival when promoted, its index)."""
        oldest = self._bands[index].oldest()
        if self._aging_s is None or oldest is None:
            return index, 1, 0.0, index
        level = max(0, index - int((now - oldest.enqueued_at) // self._aging_s))
        if level == index:
            return index, 1, 0.0, index
        return level, 0, oldest.enqueued_at, index


def _heap_in_order(heap: list[tuple[float, int, Entry[T]]]
                   ) -> Iterator[tuple[float, int, Entry[T]]]:
    """A heap's items in sorted order, without changing it: a side heap of indices,
    so taking the first k costs O(k log k)."""
    if not heap:
        return
    frontier = [(heap[0][0], heap[0][1], 0)]
    while frontier:
        _, _, i = heapq.heappop(frontier)
        yield heap[i]
        for child in (2 * i + 1, 2 * i + 2):
            if child < len(heap):
                heapq.heappush(frontier, (heap[child][0], heap[child][1], child))
