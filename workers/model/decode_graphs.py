"""Decode steps replayed from captured graphs, one per batch-size bucket.

A decode step's shapes depend only on its batch size: one token per sequence, and
block tables as wide as the longest sequence may need (``max_model_len /
block_size`` blocks). So the step is captured once per bucket of batch sizes (1, 2,
4, 8, 16, then multiples of 16 up to ``max_num_seqs``) and replayed: the host
launches one graph instead of hundreds of kernels. What a step reads lives in one
static int32 buffer on the device, laid out per bucket ``b`` as::

    | tokens b | positions b | slots b | seq_lens b | adapter runs 3 x b | tables b x width |

and a step fills it with one host-to-device copy. A batch of ``n`` sequences runs
the smallest bucket ``b >= n``; rows ``n .. b-1`` are padding: token 0, position 0,
slot -1 (the K/V store skips it), sequence length 0 (attention reads no key), an
empty adapter run. Their outputs are undefined and dropped; every op is row-wise, so
they reach no real row. Stale table entries past a sequence's length are never read
(kernels stop at ``seq_lens``), so a step writes only the blocks its sequences have.

The capture is behind ``GraphCapture``: ``CudaGraphCapture`` records CUDA graphs
(all buckets share one memory pool, captured largest first, as vLLM and nano-vllm
do); ``EagerCapture`` runs the same step function at each replay, so the CPU tests
exercise the bucketing, padding and static buffers the GPU replays.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from workers.attention.metadata import AttentionMetadata
from workers.lora.segments import LoraSegments
from workers.model.step_input import StepInput

PAD_SLOT = -1
ROW_FIELDS = 7  # per row: token, position, slot, length, adapter run start, end, slot
DecodeStep = Callable[[torch.Tensor, AttentionMetadata, LoraSegments | None], torch.Tensor]
Replay = Callable[[], torch.Tensor]


def capture_sizes(max_num_seqs: int) -> tuple[int, ...]:
    """Batch-size buckets: 1, 2, 4, 8, 16, then multiples of 16 up to the first that
    holds ``max_num_seqs``."""
    sizes = [1]
    while sizes[-1] < max_num_seqs:
        sizes.append(2 * sizes[-1] if sizes[-1] < 16 else sizes[-1] + 16)
    return tuple(sizes)


class GraphCapture(Protocol):
    """Turns a step function over static buffers into a replay."""

    def capture(self, step: Callable[[], torch.Tensor]) -> Replay:
        """A replay: each call recomputes ``step()`` over the buffers' current contents
        and returns its output, valid until the next replay of any bucket."""
        ...


class EagerCapture:
    """Replays by running the step again (the CPU, and tests of the buffer logic)."""

    def capture(self, step: Callable[[], torch.Tensor]) -> Replay:
        """``step`` itself."""
        return step


class CudaGraphCapture:
    """Records CUDA graphs sharing one memory pool; a replay launches the graph."""

    def __init__(self) -> None:
        self._pool: tuple[int, int] | None = None

    def capture(self, step: Callable[[], torch.Tensor]) -> Replay:
        """Warm ``step`` up once on a side stream (Triton compiles, cuBLAS picks its
        kernels), then record it."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            output = step()
        if self._pool is None:
            self._pool = graph.pool()

        def replay() -> torch.Tensor:
            graph.replay()
            return output

        return replay


class DecodeGraphs:
    """Decode steps of up to ``max(capture_sizes(max_num_seqs))`` sequences of at most
    ``max_blocks_per_seq`` blocks, replayed through ``capture``.

    ``decode(input_ids, metadata, runs)`` is the step: logits [B, vocab] of one token
    per sequence, with ``runs`` the batch's LoRA adapter runs (None: the base model
    alone); it must make no host sync and read nothing but its arguments and state
    fixed at capture (weights, caches, adapter slots, which loads fill in place).
    Built once; captures every bucket, largest first, and with ``adapters`` a second
    graph per bucket that adds the adapters' deltas (a batch without adapters replays
    the base graph, which launches none of their kernels).
    """

    def __init__(self, decode: DecodeStep, capture: GraphCapture, *, max_num_seqs: int,
                 max_blocks_per_seq: int, block_size: int, num_blocks: int,
                 device: torch.device, adapters: bool = False) -> None:
        self.sizes = capture_sizes(max_num_seqs)
        self.width = max_blocks_per_seq
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.adapters = adapters
        self._decode = decode
        largest = self.sizes[-1]
        self._buffer = torch.zeros(largest * (ROW_FIELDS + self.width), dtype=torch.int32,
                                   device=device)
        self._host = torch.zeros_like(self._buffer, device="cpu",
                                      pin_memory=device.type == "cuda")
        self._query_start = torch.arange(largest + 1, dtype=torch.int32, device=device)
        self._replays: dict[tuple[int, bool], Replay] = {}
        for with_adapters in (False, True) if adapters else (False,):
            for size in reversed(self.sizes):
                padding = self._padding(size)
                self._buffer[: len(padding)].copy_(padding)
                self._replays[size, with_adapters] = capture.capture(
                    self._step_function(size, with_adapters))

    def runs(self, batch: Sequence[StepInput]) -> bool:
        """Whether ``batch`` is a decode step these graphs hold: one new token per
        sequence, few enough sequences, tables narrow enough, adapters only when
        captured with them."""
        return (len(batch) <= self.sizes[-1]
                and all(len(step.token_ids) == 1 and len(step.block_table) <= self.width
                        and (self.adapters or step.lora_slot is None) for step in batch))

    def execute(self, batch: Sequence[StepInput]) -> torch.Tensor:
        """Logits [len(batch), vocab] of ``batch`` (``runs(batch)`` must hold), valid
        until the next call. Raises ValueError when a block table does not cover its
        position or names a block outside the cache, before anything is written."""
        size = next(size for size in self.sizes if size >= len(batch))
        packed = torch.frombuffer(self._pack(batch, size), dtype=torch.int32)
        low, high = torch.aminmax(packed[ROW_FIELDS * size :])  # every table at once
        if not 0 <= int(low) <= int(high) < self.num_blocks:
            raise ValueError(f"block table names a block outside [0, {self.num_blocks})")
        self._host[: len(packed)].copy_(packed)
        self._buffer[: len(packed)].copy_(self._host[: len(packed)], non_blocking=True)
        with_adapters = any(step.lora_slot is not None for step in batch)
        return self._replays[size, with_adapters]()[: len(batch)]

    def _pack(self, batch: Sequence[StepInput], size: int) -> array:
        """The bucket's buffer contents for ``batch``, padding rows included (table
        entries past a row's blocks are 0). Each row is its own adapter run: ``[row,
        row + 1)`` under its slot, or the empty run ``[row, row)`` for a base-model
        row."""
        packed = self._padding_array(size)
        tables = ROW_FIELDS * size
        for row, step in enumerate(batch):
            position, table = step.num_computed_tokens, step.block_table
            if position // self.block_size >= len(table):
                raise ValueError(f"sequence {row}: {len(table)} blocks of {self.block_size} "
                                 f"cannot hold {position + 1} tokens")
            block = table[position // self.block_size]
            packed[row] = step.token_ids[0]
            packed[size + row] = position
            packed[2 * size + row] = block * self.block_size + position % self.block_size
            packed[3 * size + row] = position + 1
            if step.lora_slot is not None:
                packed[5 * size + row] = row + 1
                packed[6 * size + row] = step.lora_slot
            start = tables + row * self.width
            packed[start : start + len(table)] = array("i", table)
        return packed

    def _padding_array(self, size: int) -> array:
        packed = array("i", bytes(4 * size * (ROW_FIELDS + self.width)))
        packed[2 * size : 3 * size] = array("i", [PAD_SLOT]) * size
        packed[4 * size : 6 * size] = array("i", range(size)) * 2  # empty runs [row, row)
        return packed

    def _padding(self, size: int) -> torch.Tensor:
        return torch.frombuffer(self._padding_array(size), dtype=torch.int32)

    def _step_function(self, size: int, with_adapters: bool) -> Callable[[], torch.Tensor]:
        buffer = self._buffer

        def field(index: int) -> torch.Tensor:
            return buffer[index * size : (index + 1) * size]

        def step() -> torch.Tensor:
            metadata = AttentionMetadata(
                positions=field(1).long(),
                slot_mapping=field(2).long(),
                query_start_loc=self._query_start[: size + 1],
                seq_lens=field(3),
                block_tables=buffer[ROW_FIELDS * size : size * (ROW_FIELDS + self.width)]
                .view(size, self.width),
                max_query_len=1,
                max_seq_len=self.width * self.block_size,
            )
            runs = None
            if with_adapters:
                runs = LoraSegments(field(4).long(), field(5).long(), field(6).long())
            return self._decode(field(0), metadata, runs)

        return step
