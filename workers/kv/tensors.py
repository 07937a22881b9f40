"""Per-layer K and V cache tensors, preallocated once, and batched block copies.

Layout (the contract with ``ModelRunner(model, key_caches, value_caches,
block_size)``): ``key_caches[layer]`` and ``value_caches[layer]`` are contiguous
``[num_blocks, block_size, num_kv_heads, head_dim]`` tensors. All of them are views
of one buffer ``[2, num_layers, num_blocks, block_size, num_kv_heads, head_dim]``,
so copying blocks for every layer, K and V, is a single gather and a single scatter.

Layout version. ``KV_LAYOUT_VERSION`` goes into every cache namespace
(``kv_layout_version``): blocks written under one layout are never read under
another, in device memory or in a tier that stores ``read_slots`` bytes.
``KV_LAYOUT_FINGERPRINTS`` records ``layout_fingerprint()`` for each version; a test
fails when the layout changes and the version does not (add a version, never edit
a recorded fingerprint).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import torch

from workers.kv.ids import BlockId
from workers.kv.plan import gpu_kv_budget
from workers.kv.spec import KVCacheSpec

KV_LAYOUT_VERSION = 1
KV_LAYOUT_FINGERPRINTS = {
    1: "f33ac4ce17779ab588327287cfba886b1e1ab4acf2e5ae47fd7cf3382f9c880f",
}


def torch_dtype(spec: KVCacheSpec) -> torch.dtype:
    """The torch dtype of ``spec.dtype`` (its canonical name is the torch name)."""
    return getattr(torch, spec.dtype)


def free_memory_budget(fraction: float, device: torch.device | str,
                       peak_activation_bytes: int) -> int:
    """The KV budget of CUDA ``device`` under ``gpu_memory_utilization`` ``fraction``
    (``plan.gpu_kv_budget``): its total memory, less what torch holds now (call it
    after the weights are loaded and before the KV cache is) and the measured
    ``peak_activation_bytes``. ValueError for a CPU device (give bytes there) or when
    nothing is left."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"a memory fraction needs a CUDA device, got {device}: give bytes")
    _, total_bytes = torch.cuda.mem_get_info(device)
    weights_bytes = torch.cuda.memory_allocated(device)
    return gpu_kv_budget(total_bytes, fraction, weights_bytes, peak_activation_bytes)


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
                              pin_memory=self.device.type == "cuda")
        staging.copy_(gathered)
        return staging.numpy().tobytes()

    def read_block(self, block: BlockId) -> bytes:
        """``read_slots`` of every position of ``block``: what ``write_block`` takes."""
        start = block * self.block_size
        return self.read_slots(range(start, start + self.block_size))

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


def layout_fingerprint() -> str:
    """SHA-256 of the layout as a probe cache shows it: the per-layer cache shape and
    the bytes of one block read with ``read_slots`` after every element was set to a
    number naming its place (K or V, layer, block, slot, head, dim). Any change of
    shapes, element order or K/V order changes it."""
    spec = KVCacheSpec(num_layers=2, num_kv_heads=2, head_dim=3, dtype="float32", block_size=2)
    tensors = KVCacheTensors(spec, num_blocks=2)
    caches = [*tensors.key_caches, *tensors.value_caches]
    for index, cache in enumerate(caches):
        numbers = torch.arange(cache.numel(), dtype=torch.float32) + index * cache.numel()
        cache.copy_(numbers.view(cache.shape))
    shape = {"cache_shape": list(caches[0].shape), "num_caches": len(caches)}
    digest = hashlib.sha256(json.dumps(shape, sort_keys=True).encode())
    digest.update(tensors.read_slots(range(spec.block_size, 2 * spec.block_size)))
    return digest.hexdigest()
