"""The engine: one step is schedule -> run -> postprocess.

``Engine`` is synchronous and single-threaded (``workers.engine.async_engine`` runs
it on a dedicated thread). A step computes the scheduled chunks in one batched
model call, samples a token for every sequence whose uncomputed tokens are now
all computed, appends it, checks stop conditions, and returns per-request
outputs. Prefix-cache commits: whole blocks after each prefill chunk, everything
computed when a sequence finishes, is preempted or is aborted.

One request's failure ends that request only: an exception while preparing its
inputs, sampling its rows or detokenizing its tokens is logged, its blocks are
released, and its last output carries an error; the rest of the batch goes on.
Only an exception from the batched model call (or the scheduler) leaves ``step``,
and then the caller fails the step (``fail_step``), which aborts every request.
Failed steps are counted (``engine_failed_steps_total``), and so is every torch
out-of-memory error the engine catches (``engine_out_of_memory_total``): one that
failed a step, a batch sampled again request by request, or one request alone (its
inputs, its sampling, its LoRA adapter's load).

Invariant (checked by tests between steps): every sequence in ``scheduler.running``
holds blocks in the KV manager, no other does; free + cached + in-use = total.
"""

from __future__ import annotations

import itertools
import logging
import sys
import time
from collections.abc import Sequence as SequenceOf

import torch

from radix.tokenizer import PromptTokenizer
from workers.config import EngineConfig
from workers.engine.metrics import EngineMetrics, EngineStats, TailBlockFill
from workers.engine.request import (
    ChoiceDelta,
    GenerationRequest,
    RequestOutput,
    UnknownAdapterError,
    Usage,
)
from workers.engine.scheduler import ScheduledChunk, Scheduler
from workers.engine.sequence import RequestState, Sequence, SequenceStatus
from workers.engine.stopping import StopChecker
from workers.engine.trace import log_finished
from workers.kv.manager import KVCacheManager
from workers.lora.adapters import AdapterSlots
from workers.model.runner import ModelRunner
from workers.model.sampler import position_generator, sample
from workers.model.step_input import StepInput

log = logging.getLogger(__name__)


class Engine:
    """Continuous-batching engine over one model and one KV cache manager.

    Callers (one thread) add and abort requests by id and call ``step`` while
    ``has_work()``; ids must be unique among live requests. ``abort_request``
    releases a request's blocks before it returns. ``kv_dtype`` is the KV format's
    dtype for the request trace (default: the cache tensors'; a timed worker's
    tensors are placeholders).
    """

    def __init__(
        self,
        manager: KVCacheManager,
        runner: ModelRunner,
        tokenizer: PromptTokenizer,
        config: EngineConfig,
        max_model_len: int,
        metrics: EngineMetrics,
        adapters: AdapterSlots | None = None,
        kv_dtype: str | None = None,
    ) -> None:
        self.manager = manager
        self._kv_dtype = kv_dtype or manager.tensors.spec.dtype
        self.adapters = adapters or AdapterSlots.disabled()
        self.scheduler = Scheduler(manager, config, self.adapters,
                                   lambda state: self._fail(state, "loading its LoRA adapter"))
        self._runner = runner
        self._tokenizer = tokenizer
        self._max_model_len = max_model_len
        self._metrics = metrics
        self._requests: dict[int, RequestState] = {}
        self._failures: dict[int, RequestOutput] = {}
        self._seq_ids = itertools.count()
        self._block_size = manager.block_size
        self._num_prompt_tokens = 0
        self._num_generation_tokens = 0
        self._num_failed_steps = 0
        self._num_out_of_memory = 0

    # ---- requests ------------------------------------------------------------------

    def add_request(
        self, request_id: int, request: GenerationRequest, arrival_time: float | None = None
    ) -> None:
        """Queue ``request``; its prompt plus ``max_tokens`` must fit ``max_model_len``
        (the server checks this before submitting). ``arrival_time`` (``time.monotonic``,
        default now) is where time to first token starts. UnknownAdapterError (nothing
        queued) for an adapter that is not registered."""
        arrival = time.monotonic() if arrival_time is None else arrival_time
        state = RequestState(request_id, request, arrival)
        if request.adapter is not None:
            try:
                state.namespace = self.adapters.begin(request.adapter)
            except KeyError:
                raise UnknownAdapterError(f"the LoRA adapter {request.adapter!r} is not "
                                          "registered on this worker") from None
        self._requests[request_id] = state
        seq = self._new_sequence(state, 0, list(request.prompt_token_ids),
                                 request.prompt_key or b"")
        self.scheduler.add(seq)

    def abort_request(self, request_id: int) -> None:
        """Drop a request (no-op if unknown or finished): computed tokens are committed
        to the prefix cache and every block is released now."""
        state = self._requests.pop(request_id, None)
        if state is None:
            return
        for seq in state.sequences:
            self._release(seq)
        self._end_adapter(state)

    def _end_adapter(self, state: RequestState) -> None:
        """The request left the engine: it no longer counts for its adapter."""
        if state.request.adapter is not None:
            self.adapters.end(state.request.adapter, state.lora_slot is not None)

    def fail_step(self, error: Exception) -> list[int]:
        """After ``step`` raised ``error``: count the failed step (and ``error`` when it
        is torch's out of memory), abort every request and return their ids, with those
        of requests that failed alone in the failed step (their outputs are dropped)."""
        self._num_failed_steps += 1
        self._count_out_of_memory(error)
        request_ids = [*self._requests, *self._failures]
        self._failures.clear()
        for request_id in list(self._requests):
            self.abort_request(request_id)
        self.scheduler.end_step()
        return request_ids

    def has_work(self) -> bool:
        """True while any request is waiting or running."""
        return bool(self._requests)

    # ---- the step ------------------------------------------------------------------

    def step(self) -> dict[int, RequestOutput]:
        """Run one batch; returns outputs of the requests that produced tokens or
        failed alone. Raises only when the batch as a whole failed."""
        chunks, inputs = self._prepare(self.scheduler.schedule())
        logits = self._runner.execute(inputs) if chunks else None
        self.scheduler.end_step()
        outputs = self._postprocess(chunks, logits) if logits is not None else {}
        outputs.update(self._failures)
        self._failures.clear()
        return outputs

    def _prepare(self, chunks: list[ScheduledChunk]
                 ) -> tuple[list[ScheduledChunk], list[StepInput]]:
        """Each chunk's model input; a request whose input fails is failed and all its
        chunks leave the batch."""
        inputs: dict[int, StepInput] = {}
        for row, chunk in enumerate(chunks):
            if chunk.seq.request.request_id not in self._requests:
                continue
            try:
                inputs[row] = self._step_input(chunk)
            except Exception:
                self._fail(chunk.seq.request, "preparing its inputs")
        kept = [row for row in inputs if chunks[row].seq.request.request_id in self._requests]
        return [chunks[row] for row in kept], [inputs[row] for row in kept]

    def _step_input(self, chunk: ScheduledChunk) -> StepInput:
        seq, start, num_new = chunk
        return StepInput(
            token_ids=seq.token_ids[start : start + num_new],
            num_computed_tokens=start,
            block_table=self.manager.block_table(seq.seq_id),
            lora_slot=seq.request.lora_slot,
        )

    def _fail(self, state: RequestState, stage: str) -> None:
        """End ``state`` alone after an exception in ``stage`` (call from its handler):
        log it (and count it when it is out of memory), release its blocks, queue its
        error output."""
        log.exception("request %d failed while %s; the rest of the batch goes on",
                      state.request_id, stage)
        self._count_out_of_memory(sys.exception())
        self.abort_request(state.request_id)
        self._failures[state.request_id] = RequestOutput(
            (), error=f"the worker failed while {stage} for this request")

    def _count_out_of_memory(self, error: BaseException | None) -> None:
        if isinstance(error, torch.OutOfMemoryError):
            self._num_out_of_memory += 1

    def _postprocess(
        self, chunks: SequenceOf[ScheduledChunk], logits: torch.Tensor
    ) -> dict[int, RequestOutput]:
        rows: list[int] = []
        to_sample: list[Sequence] = []
        block_size = self._block_size
        for row, (seq, start, num_new) in enumerate(chunks):
            end = start + num_new
            if num_new > 1 and end >= block_size:  # whole blocks, shareable at once
                self.manager.commit(seq.seq_id, seq.key(end - end % block_size))
            if end < len(seq.token_ids):
                continue
            if seq.request.is_forked:
                rows.append(row)
                to_sample.append(seq)
            else:
                family = self._fork(seq)
                rows.extend([row] * len(family))
                to_sample.extend(family)
        if not to_sample:
            return {}
        deltas: dict[int, list[ChoiceDelta]] = {}
        requests = self._requests
        now = time.monotonic()
        for seq, token_id in zip(to_sample, self._sample(logits, rows, to_sample), strict=True):
            request_id = seq.request.request_id
            if token_id is None or request_id not in requests:
                continue
            try:
                delta = self._append(seq, token_id, now)
            except Exception:
                self._fail(seq.request, "detokenizing")
                continue
            items = deltas.get(request_id)
            if items is None:
                deltas[request_id] = [delta]
            else:
                items.append(delta)
        return {rid: self._output(requests[rid], items) for rid, items in deltas.items()
                if rid in requests}

    def _sample(self, logits: torch.Tensor, rows: list[int], seqs: list[Sequence]
                ) -> list[int | None]:
        """One token per sequence, sampled as one batch. If the batch fails, each
        request's rows are sampled on their own so that only the request at fault
        fails (None for its rows)."""
        try:
            return _sample_rows(logits, rows, seqs)
        except Exception as exc:
            self._count_out_of_memory(exc)
            log.warning("batched sampling failed; sampling each request on its own")
        by_request: dict[int, list[int]] = {}
        for i, seq in enumerate(seqs):
            by_request.setdefault(seq.request.request_id, []).append(i)
        token_ids: list[int | None] = [None] * len(seqs)
        for indices in by_request.values():
            try:
                sampled = _sample_rows(logits, [rows[i] for i in indices],
                                       [seqs[i] for i in indices])
            except Exception:
                self._fail(seqs[indices[0]].request, "sampling")
                continue
            for i, token_id in zip(indices, sampled, strict=True):
                token_ids[i] = token_id
        return token_ids

    def _append(self, seq: Sequence, token_id: int, now: float) -> ChoiceDelta:
        previous_time = seq.last_token_time
        seq.append_token(token_id, now)
        self._num_generation_tokens += 1
        if previous_time is None:
            num_prompt_tokens = seq.request.num_prompt_tokens
            self._metrics.observe_ttft(now - seq.request.arrival_time, num_prompt_tokens)
            if seq.index == 0:
                self._num_prompt_tokens += num_prompt_tokens
        else:
            self._metrics.observe_tpot(now - previous_time, seq.request.num_prompt_tokens)
        step = seq.stop_checker.append(token_id, len(seq.token_ids))
        if step.finish_reason is not None:
            seq.finish_reason = step.finish_reason
            self._release(seq)
        return ChoiceDelta(seq.index, (token_id,), step.text, step.finish_reason)

    def _output(self, state: RequestState, deltas: list[ChoiceDelta]) -> RequestOutput:
        """The request's output for this step; a request can only have finished in a
        step where one of its choices did."""
        if not any(delta.finish_reason for delta in deltas) or not state.is_finished:
            return RequestOutput(tuple(deltas))
        del self._requests[state.request_id]
        self._end_adapter(state)
        self._metrics.observe_finished(state.num_prompt_tokens, state.num_completion_tokens())
        log_finished(state, self._kv_dtype)
        usage = Usage(
            prompt_tokens=state.num_prompt_tokens,
            completion_tokens=state.num_completion_tokens(),
            cached_tokens=min(state.num_cached_tokens or 0, state.num_prompt_tokens),
        )
        return RequestOutput(tuple(deltas), usage)

    # ---- sequences -----------------------------------------------------------------

    def _new_sequence(self, state: RequestState, index: int, token_ids: list[int],
                      key: bytes = b"") -> Sequence:
        params = state.request.params
        stop_checker = StopChecker(
            self._tokenizer, params, self._tokenizer.eos_token_ids, self._max_model_len
        )
        seed = params.sampling.seed
        if seed is not None:
            seed = (seed + index) % 2**63
        stop_checker.replay(token_ids[state.num_prompt_tokens:], state.num_prompt_tokens)
        seq = Sequence(next(self._seq_ids), state, index, token_ids, stop_checker, seed, key)
        state.sequences.append(seq)
        return seq

    def _fork(self, parent: Sequence) -> list[Sequence]:
        """After the prompt is computed, split an ``n > 1`` request into its choices;
        children share the parent's blocks (copied on their first write)."""
        state = parent.request
        family = [parent]
        for index in range(1, state.request.params.n):
            child = self._new_sequence(state, index, list(parent.token_ids),
                                       parent.key(len(parent.token_ids)))
            self.manager.fork(parent.seq_id, child.seq_id)
            self.scheduler.add_running(child)
            family.append(child)
        state.is_forked = True
        return family

    def _release(self, seq: Sequence) -> None:
        """Commit what ``seq`` has computed and free it. Positions assigned to a step
        that has not run (its request failed while preparing, or the batch failed) have
        no KV yet: only those before the chunk are committed."""
        if seq.status is SequenceStatus.RUNNING:
            self.manager.commit(seq.seq_id, seq.key(self.scheduler.num_written_tokens(seq)))
        self.scheduler.release(seq)

    # ---- observation ---------------------------------------------------------------

    def stats(self) -> EngineStats:
        """Load and KV counters now (engine thread; others read published copies)."""
        running = {seq.request.request_id for seq in self.scheduler.running}
        uncomputed = [self.scheduler.num_uncomputed_tokens(s) for s in self.scheduler.running]
        waiting_tokens = sum(len(s.token_ids) for s in self.scheduler.waiting)
        waiting_tokens += sum(n for n in uncomputed if n > 1)
        return EngineStats.collect(
            self.manager,
            num_requests_running=len(running),
            num_requests_waiting=len(self._requests) - len(running),
            num_waiting_tokens=waiting_tokens,
            num_preemptions=self.scheduler.num_preemptions,
            num_swaps=self.scheduler.num_swaps,
            num_stalls=self.scheduler.num_stalls,
            num_failed_steps=self._num_failed_steps,
            num_out_of_memory=self._num_out_of_memory,
            num_prompt_tokens=self._num_prompt_tokens,
            num_generation_tokens=self._num_generation_tokens,
            tail_fill=TailBlockFill.measure(
                [(len(s.token_ids), self.manager.num_table_blocks(s.seq_id))
                 for s in self.scheduler.running], self._block_size),
        )


def _sample_rows(logits: torch.Tensor, rows: list[int], seqs: list[Sequence]) -> list[int]:
    """The next token of each of ``seqs`` from its logits row ``rows[i]``; a seeded
    sequence draws from the generator of its seed and the position of the new token."""
    generators = [None if seq.seed is None
                  else position_generator(seq.seed, len(seq.token_ids), logits.device)
                  for seq in seqs]
    if rows != list(range(logits.shape[0])):  # a decode-only batch samples every row once
        logits = logits[rows]
    return sample(logits, [seq.request.request.params.sampling for seq in seqs], generators)
