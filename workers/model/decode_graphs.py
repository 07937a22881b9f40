"""Decode steps replayed from captured graphs, one per batch-size bucket.

A decode step's shapes depend only on its batch size: one token per sequence, and
block tables as wide as the longest sequence may need (``max_model_len /
block_size`` blocks). So the step is captured once per bucket of batch sizes (1, 2,
4, 8, 16, then multiples of 16 up to ``max_num_seqs``) and replayed: the host
launches one graph instead of hundreds of kernels. What a step reads lives in one
static int32 buffer on the device, laid out per bucket ``b`` as::

    | token ids b | positions b | slots b | seq_lens b | block tables b x width |

and a step fills it with one host-to-device copy. A batch of ``n`` sequences runs
the smallest bucket ``b >= n``; rows ``n .. b-1`` are padding: token 0, position 0,
slot -1 (the K/V store skips it), sequence length 0 (attention reads no key). Their
outputs are undefined and dropped; every op is row-wise, so they reach no real row. Stale table entries past a sequence's
length are never read (kernels stop at ``seq_lens``), so a step writes only the
blocks its sequences have.

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
from workers.model.step_input import StepInput

PAD_SLOT = -1
DecodeStep = Callable[[torch.Tensor, AttentionMetadata], torch.Tensor]
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

    ``decode(input_ids, metadata)`` is the step: logits [B, vocab] of one token per
    sequence; it must make no host sync and read nothing but its arguments and state
    fixed at capture (weights, caches). Built once; captures every bucket, largest
    first.
    """

    def __init__(self, decode: DecodeStep, capture: GraphCapture, *, max_num_seqs: int,
                 max_blocks_per_seq: int, block_size: int, num_blocks: int,
                 device: torch.device) -> None:
        self.sizes = capture_sizes(max_num_seqs)
        self.width = max_blocks_per_seq
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._decode = decode
        largest = self.sizes[-1]
        self._buffer = torch.zeros(largest * (4 + self.width), dtype=torch.int32, device=device)
        self._host = torch.zeros_like(self._buffer, device="cpu",
                                      pin_memory=device.type == "cuda")
        self._query_start = torch.arange(largest + 1, dtype=torch.int32, device=device)
        self._replays: dict[int, Replay] = {}
        for size in reversed(self.sizes):
            self._buffer[: size * (4 + self.width)].copy_(self._padding(size))
            self._replays[size] = capture.capture(self._step_function(size))

    def runs(self, batch: Sequence[StepInput]) -> bool:
        """Whether ``batch`` is a decode step these graphs hold: one new token per
        sequence, no adapter, few enough sequences, tables narrow enough."""
        return (len(batch) <= self.sizes[-1]
                and all(len(step.token_ids) == 1 and step.lora_slot is None
                        and len(step.block_table) <= self.width for step in batch))

    def execute(self, batch: Sequence[StepInput]) -> torch.Tensor:
        """Logits [len(batch), vocab] of ``batch`` (``runs(batch)`` must hold). Raises
        ValueError when a block table does not cover its position or names a block
        outside the cache, before anything is written."""
        size = next(size for size in self.sizes if size >= len(batch))
        packed = self._pack(batch, size)
        self._host[: len(packed)].copy_(torch.frombuffer(packed, dtype=torch.int32))
        self._buffer[: len(packed)].copy_(self._host[: len(packed)], non_blocking=True)
        return self._replays[size]()[: len(batch)]

    def _pack(self, batch: Sequence[StepInput], size: int) -> array:
        """The bucket's buffer contents for ``batch``, padding rows included."""
        packed = self._padding_array(size)
        tables = 4 * size
        for row, step in enumerate(batch):
            position, table = step.num_computed_tokens, step.block_table
            if position // self.block_size >= len(table):
                raise ValueError(f"sequence {row}: {len(table)} blocks of {self.block_size} "
                                 f"cannot hold {position + 1} tokens")
            if table and not 0 <= min(table) <= max(table) < self.num_blocks:
                raise ValueError(f"block table names a block outside [0, {self.num_blocks})")
            block = table[position // self.block_size]
            packed[row] = step.token_ids[0]
            packed[size + row] = position
            packed[2 * size + row] = block * self.block_size + position % self.block_size
            packed[3 * size + row] = position + 1
            start = tables + row * self.width
            packed[start : start + len(table)] = array("i", table)
        return packed

    def _padding_array(self, size: int) -> array:
        packed = array("i", bytes(4 * size * (4 + self.width)))
        packed[2 * size : 3 * size] = array("i", [PAD_SLOT]) * size
        return packed

    def _padding(self, size: int) -> torch.Tensor:
        return torch.frombuffer(self._padding_array(size), dtype=torch.int32)

    def _step_function(self, size: int) -> Callable[[], torch.Tensor]:
        buffer = self._buffer

        def step() -> torch.Tensor:
            metadata = AttentionMetadata(
                positions=buffer[size : 2 * size].long(),
                slot_mapping=buffer[2 * size : 3 * size].long(),
                query_start_loc=self._query_start[: size + 1],
                seq_lens=buffer[3 * size : 4 * size],
                block_tables=buffer[4 * size : size * (4 + self.width)].view(size, self.width),
                max_query_len=1,
                max_seq_len=self.width * self.block_size,
            )
            return self._decode(buffer[:size], metadata)

        return step
