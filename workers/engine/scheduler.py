"""Continuous-batching scheduler: which sequences compute how many tokens this step.

Both queues keep their sequences in scheduling order (``Sequence.order``: the
request's priority, lower first, then its arrival; vLLM's priority policy, which is
first come, first served when every priority is equal). Policy, in order, under a
budget of ``max_batched_tokens`` tokens per step:

1. Running sequences that decode (one uncomputed token) go first, in order, so
   a long prefill never stalls generation; then running sequences still
   prefilling get the rest of the budget, in order (chunked prefill: a prompt
   longer than what is left is cut, and continues next step).
2. Each scheduled sequence first gets its KV slots (``append_slots``). When the
   pool is out of blocks even after evicting cached leaves, running sequences not
   yet scheduled this step are preempted, the last in order first (the lowest
   priority, then the latest arrival), until the slots fit. Decodes go in order
   and a prompt's blocks are reserved at admission, so the victim is the last of
   all running sequences: vLLM's choice. A preempted sequence's computed tokens
   are committed to the prefix cache, its blocks
   released, and it waits at its place in the order to be recomputed (usually from
   its own cached prefix); in ``swap`` mode (or ``auto`` for long sequences) its
   leaves also move to the host tier at once, to be copied back when it is
   admitted again. A sequence that is itself the last in order preempts itself.
3. If nothing was preempted this step, waiting sequences are admitted in order
   while the KV manager can reserve their blocks after the prefix match (it evicts
   cached leaves first) and still leave its watermark of blocks for the running
   sequences to grow into, and ``max_num_seqs`` allows. The first one that does not
   fit stops admission (no overtaking: large requests do not starve behind small
   ones of their priority). A waiting sequence never preempts a running one,
   whatever their priorities: as in vLLM v1, it waits for running sequences to
   finish or to be preempted by the growth of sequences before them.
   A request for a LoRA adapter first pins the adapter's slot (``AdapterSlots``,
   loading it if needed); with every slot pinned it waits at the head the same way.
   A load that fails hands the request to ``on_load_failure`` (the engine fails it
   alone, which takes it off the queue).

Liveness: a waiting sequence waits only behind running ones, which finish or are
preempted, and the waiting ones before it in order (a stream of requests of a
higher priority delays a lower one for as long as it lasts, as in vLLM). The first
running sequence in order is preempted only by itself, so it always progresses. The
KV manager admits any prompt that fits the pool when nothing else is
live, and the server refuses longer ones before they queue, so admission failing
with nothing running is a bug: it is logged and counted (``num_stalls``), once per
sequence.

The scheduler never runs the model; the engine does, then reports back.
"""

from __future__ import annotations

import logging
from bisect import bisect_left, insort
from collections.abc import Callable, Iterator
from operator import attrgetter
from typing import NamedTuple

from radix.keys import TOKEN_BYTES
from workers.config import EngineConfig
from workers.engine.sequence import RequestState, Sequence, SequenceStatus
from workers.kv.manager import KVCacheManager
from workers.lora.adapters import AdapterSlots

log = logging.getLogger(__name__)
_ORDER = attrgetter("order")


class ScheduledChunk(NamedTuple):
    """Positions ``[num_computed_tokens, num_computed_tokens + num_new_tokens)`` of
    ``seq`` to compute this step (slots already reserved). ``num_computed_tokens`` is
    the KV manager's count when the chunk was scheduled: the positions whose KV was
    written before this step."""

    seq: Sequence
    num_computed_tokens: int
    num_new_tokens: int


class OrderedSequences:
    """Sequences kept sorted by ``Sequence.order``: ``[0]`` is the first (the next to
    admit, of a waiting queue), ``[-1]`` the last (the first to preempt, of a running
    list), and iteration goes in order. Adding or removing one costs a binary search
    and a move of the pointers behind it; nothing is sorted per step."""

    def __init__(self) -> None:
        self._seqs: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        """Put ``seq`` at its place in the order."""
        insort(self._seqs, seq, key=_ORDER)

    def remove(self, seq: Sequence) -> None:
        """Take ``seq`` out; ValueError when it is not here."""
        index = bisect_left(self._seqs, seq.order, key=_ORDER)
        if index == len(self._seqs) or self._seqs[index] is not seq:
            raise ValueError(f"{seq!r} is not here")
        del self._seqs[index]

    def pop_first(self) -> Sequence:
        """Take out and return the first sequence."""
        return self._seqs.pop(0)

    def __getitem__(self, index: int) -> Sequence:
        return self._seqs[index]

    def __len__(self) -> int:
        return len(self._seqs)

    def __iter__(self) -> Iterator[Sequence]:
        return iter(self._seqs)


class Scheduler:
    """Owns the waiting queue and the running list; talks to the KV manager for
    admission, slots, preemption and release. Engine thread only."""

    def __init__(self, manager: KVCacheManager, config: EngineConfig,
                 adapters: AdapterSlots | None = None,
                 on_load_failure: Callable[[RequestState], None] | None = None) -> None:
        self._manager = manager
        self._config = config
        self._adapters = adapters or AdapterSlots.disabled()
        self._on_load_failure = on_load_failure
        self.waiting = OrderedSequences()
        self.running = OrderedSequences()
        self.num_preemptions = 0
        self.num_swaps = 0
        self.num_stalls = 0
        self._stalled_seq_id: int | None = None
        self._in_flight: dict[int, int] = {}  # seq_id -> start of its chunk this step

    def add(self, seq: Sequence) -> None:
        """Queue a new sequence for admission."""
        seq.status = SequenceStatus.WAITING
        self.waiting.add(seq)

    def add_running(self, seq: Sequence) -> None:
        """Adopt a sequence that already holds blocks (a fork child)."""
        seq.status = SequenceStatus.RUNNING
        self.running.add(seq)

    def release(self, seq: Sequence) -> None:
        """Drop ``seq`` from the queues and free its blocks (finish or abort); the
        caller commits what it wants cached first."""
        if seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        elif seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self._manager.free(seq.seq_id)
        seq.status = SequenceStatus.FINISHED

    def num_written_tokens(self, seq: Sequence) -> int:
        """Positions of running ``seq`` whose KV is written: the KV manager's count, or,
        while a chunk of it is in flight (scheduled, its step not ended), the chunk's
        start. What to commit when ``seq`` is released at any moment."""
        start = self._in_flight.get(seq.seq_id)
        return self._manager.num_computed_tokens(seq.seq_id) if start is None else start

    def end_step(self) -> None:
        """The step of the last ``schedule`` is over: its model call returned (its
        positions have KV), or every request was released after it failed."""
        self._in_flight = {}

    def num_uncomputed_tokens(self, seq: Sequence) -> int:
        """Tokens of ``seq`` without KV (all of them while it is not running)."""
        if seq.status is not SequenceStatus.RUNNING:
            return len(seq.token_ids)
        return len(seq.token_ids) - self._manager.num_computed_tokens(seq.seq_id)

    def schedule(self) -> list[ScheduledChunk]:
        """Pick this step's work (see the module docstring for the policy); its chunks
        are in flight until ``end_step``."""
        budget = self._config.max_batched_tokens
        self._in_flight = in_flight = {}
        chunks: list[ScheduledChunk] = []
        scheduled: set[int] = set()
        num_preemptions = self.num_preemptions
        manager = self._manager
        decodes, prefills = [], []
        for seq in self.running:
            start = manager.num_computed_tokens(seq.seq_id)
            (prefills if len(seq.token_ids) - start > 1 else decodes).append((seq, start))
        for seq, start in decodes + prefills:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            num_new = min(len(seq.token_ids) - start, budget)
            if manager.append_slots(seq.seq_id, num_new) or self._reserve(seq, num_new, scheduled):
                chunks.append(ScheduledChunk(seq, start, num_new))
                in_flight[seq.seq_id] = start
                scheduled.add(seq.seq_id)
                budget -= num_new
        if self.num_preemptions == num_preemptions:
            chunks.extend(self._admit(budget))
        return chunks

    def _reserve(self, seq: Sequence, num_new: int, scheduled: set[int]) -> bool:
        """Slots for ``num_new`` tokens of ``seq`` once they did not fit, preempting the
        unscheduled sequences last in order first until they do (a preempted
        sequence's KV count is gone, so its start taken before is never used). False
        when ``seq`` had to preempt itself. Decodes go in order and a prompt's blocks
        are reserved at admission, so a victim is the last of all running sequences,
        vLLM's choice, without taking back a chunk already scheduled."""
        while True:
            victim = next(s for s in reversed(self.running) if s.seq_id not in scheduled)
            self._preempt(victim)
            if victim is seq:
                return False
            if self._manager.append_slots(seq.seq_id, num_new):
                return True

    def _preempt(self, seq: Sequence) -> None:
        """Send running ``seq`` back to the waiting queue at its place in the order; its
        computed positions stay cached (or go to the host tier)."""
        mode = self._config.preemption_mode
        key = seq.key(self._manager.num_computed_tokens(seq.seq_id))
        if mode == "swap" or (
            mode == "auto" and len(key) // TOKEN_BYTES >= self._config.swap_min_tokens
        ):
            self._manager.swap_out(seq.seq_id, key)
            self.num_swaps += 1
        else:
            self._manager.commit(seq.seq_id, key)
            self._manager.free(seq.seq_id)
        self.running.remove(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.add(seq)
        self.num_preemptions += 1
        seq.request.num_preemptions += 1

    def _admit(self, budget: int) -> list[ScheduledChunk]:
        chunks: list[ScheduledChunk] = []
        while self.waiting and budget > 0:
            seq = self.waiting[0]
            request = seq.request
            num_seqs = 1 if request.is_forked else request.request.params.n
            if self.running and len(self.running) + num_seqs > self._config.max_num_seqs:
                break
            adapter = request.request.adapter
            if adapter is not None and request.lora_slot is None:
                try:
                    request.lora_slot = self._adapters.acquire(adapter)
                except Exception:
                    if self._on_load_failure is None:
                        raise
                    self._on_load_failure(request)
                    continue
                if request.lora_slot is None:
                    break
            num_cached = self._admit_one(seq)
            if num_cached is None:
                if not self.running:
                    self._report_stall(seq)
                break
            self.waiting.pop_first()
            seq.status = SequenceStatus.RUNNING
            self.running.add(seq)
            num_new = min(len(seq.token_ids) - num_cached, budget)
            if not self._manager.append_slots(seq.seq_id, num_new):
                self._preempt(seq)
                break
            chunks.append(ScheduledChunk(seq, num_cached, num_new))
            self._in_flight[seq.seq_id] = num_cached
            budget -= num_new
        return chunks

    def _admit_one(self, seq: Sequence) -> int | None:
        """``KVCacheManager.admit`` for ``seq``, charging its request with the blocks
        the attempt evicted and, on its first admission, the cached tokens and those
        of them that came back from the host tier."""
        manager, state = self._manager, seq.request
        request = state.request
        evicted_before = manager.num_evicted_blocks_total
        restored_before = manager.num_host_restored_blocks_total
        num_cached = manager.admit(
            seq.seq_id, seq.key(len(seq.token_ids)), request.scope,
            request.num_public_tokens, request.max_cached_tokens, state.namespace,
        )
        state.num_admission_evicted_blocks += manager.num_evicted_blocks_total - evicted_before
        if num_cached is not None and state.num_cached_tokens is None:
            state.num_cached_tokens = num_cached
            num_restored = manager.num_host_restored_blocks_total - restored_before
            state.num_host_cached_tokens = min(num_restored * manager.block_size, num_cached)
        return num_cached

    def _report_stall(self, seq: Sequence) -> None:
        """Log and count a sequence that cannot be admitted with nothing running."""
        if seq.seq_id == self._stalled_seq_id:
            return
        self._stalled_seq_id = seq.seq_id
        self.num_stalls += 1
        stats = self._manager.stats()
        log.error(
            "engine stall: sequence %d (%d tokens) cannot be admitted with nothing running "
            "(%d free, %d cached of %d blocks)",
            seq.seq_id,
            len(seq.token_ids),
            stats.num_free_blocks,
            stats.num_cached_blocks,
            stats.num_total_blocks,
        )
