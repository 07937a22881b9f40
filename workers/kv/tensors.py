"""Per-layer K and V cache tensors, preallocated once, and batched block copies.

Layout (the contract with ``ModelRunner(model, key_caches, value_caches,
block_size)``): ``key_caches[layer]`` and ``value_caches[layer]`` are contiguous
``[num_blocks, block_size, num_kv_heads, head_dim]`` tensors. All of them are views
of one buffer ``[2, num_layers, num_blocks, block_size, num_kv_heads, head_dim]``,
so copying blocks for every layer, K and V, is a single gather and a single scatter.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from workers.kv.ids import BlockId
from workers.kv.spec import KVCacheSpec


def torch_dtype(spec: KVCacheSpec) -> torch.dtype:
    """The torch dtype of ``spec.dtype`` (its canonical name is the torch name)."""
    return getattr(torch, spec.dtype)


def free_memory_budget(fraction: float, device: torch.device | str) -> int:
    """``fraction`` of the free memory of a CUDA ``device`` now, in bytes (call it after
    the model weights are loaded). ValueError for a CPU device: give bytes there."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"a memory fraction needs a CUDA device, got {device}: give bytes")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    free_bytes, _ = torch.cuda.mem_get_info(device)
    return int(free_bytes * fraction)


class KVCacheTensors:
    """K and V caches for ``num_blocks`` blocks on ``device``, zero-filled once.

    ``copy_blocks`` is the only writer here; the model runner writes new tokens'
    K and V through the slot mapping into the same tensors.
    """

    def __init__(self, spec: KVCacheSpec, num_blocks: int, device: torch.device | str = "cpu"):
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.spec = spec
        self.num_blocks = num_blocks
        self.device = torch.device(device)
        shape = (2, spec.num_layers, num_blocks, spec.block_size, spec.num_kv_heads, spec.head_dim)
        self._buffer = torch.zeros(shape, dtype=torch_dtype(spec), device=self.device)
        # Bit-level view for copies: index_copy has no float8 kernels on every device.
        self._raw = self._buffer.view(torch.uint8)
        self.key_caches: list[torch.Tensor] = list(self._buffer[0].unbind(0))
        self.value_caches: list[torch.Tensor] = list(self._buffer[1].unbind(0))

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self.spec.block_size

    @property
    def num_bytes(self) -> int:
        """Bytes held by all caches."""
        return self._buffer.numel() * self._buffer.element_size()

    def read_slots(self, slots: Sequence[int]) -> bytes:
        """The raw bytes of every layer's K and V at ``slots`` (token slots, ``block *
        block_size + offset``), laid out ``[2, layers, len(slots), kv_heads, head_dim]``:
        a whole block when ``slots`` are one block's positions. Staged through pinned
        memory on CUDA."""
        index = torch.tensor(list(slots), dtype=torch.long, device=self.device)
        gathered = self._raw.flatten(2, 3).index_select(2, index)
        staging = torch.empty(gathered.shape, dtype=torch.uint8,
                              pin_memory=self.device.type == "cuda")  # fmt: skip
        staging.copy_(gathered)
        return staging.numpy().tobytes()

    def write_block(self, block: BlockId, data: bytes) -> None:
        """Overwrite ``block`` in every layer, K and V, with bytes from ``read_slots`` of
        ``block_size`` slots (the block's own layout)."""
        target = self._raw[:, :, block]
        if len(data) != target.numel():
            raise ValueError(f"block data is {len(data)} bytes, a block is {target.numel()}")
        source = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(target.shape)
        target.copy_(source.to(self.device, non_blocking=True))

    def copy_blocks(self, pairs: Sequence[tuple[BlockId, BlockId]]) -> None:
        """Copy each ``src`` block onto its ``dst`` block in every layer, K and V.

        Destinations must be distinct and not among the sources (copy-on-write copies
        onto fresh blocks). Runs on the device's current stream, ordered with the
        model's kernels.
        """
        if not pairs:
            return
        src = torch.tensor([s for s, _ in pairs], dtype=torch.long, device=self.device)
        dst = torch.tensor([d for _, d in pairs], dtype=torch.long, device=self.device)
        self._raw.index_copy_(2, dst, self._raw.index_select(2, src))
