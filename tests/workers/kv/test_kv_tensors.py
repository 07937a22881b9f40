"""KV tensors: the layout contract with the model runner and batched block copies."""

from __future__ import annotations

import pytest
import torch

from tests.support.gpu import on_gpu
from workers.kv.spec import KVCacheSpec
from workers.kv.tensors import KVCacheTensors, free_memory_budget


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float8_e4m3fn"])
def test_layout_and_copy_blocks_every_layer_k_and_v(dtype):
    spec = KVCacheSpec(num_layers=3, num_kv_heads=2, head_dim=4, dtype=dtype, block_size=4)
    kv = KVCacheTensors(spec, num_blocks=6)
    assert len(kv.key_caches) == len(kv.value_caches) == 3
    for cache in kv.key_caches + kv.value_caches:
        assert (
            cache.shape == (6, 4, 2, 4)
            and cache.is_contiguous()
            and cache.dtype == getattr(torch, dtype)
        )
    assert kv.num_bytes == 6 * spec.kv_bytes_per_block
    for layer in range(3):
        for block in range(6):
            kv.key_caches[layer][block] = block + layer / 4
            kv.value_caches[layer][block] = -block - layer / 4
    kv.copy_blocks([(1, 4), (2, 5)])
    for layer in range(3):
        keys, values = kv.key_caches[layer].float(), kv.value_caches[layer].float()
        assert torch.equal(keys[4], keys[1]) and torch.equal(keys[5], keys[2])
        assert torch.equal(values[4], values[1]) and torch.equal(values[5], values[2])
        assert torch.all(keys[3] == 3 + layer / 4)  # untouched


def test_caches_are_views_of_one_buffer():
    kv = KVCacheTensors(KVCacheSpec(2, 1, 2, "float32", 2), num_blocks=3)
    kv.key_caches[1][2, 1, 0] = 7.0
    kv.copy_blocks([(2, 0)])
    assert torch.all(kv.key_caches[1][0, 1, 0] == 7.0) and kv.key_caches[0][0].abs().sum() == 0


def test_free_memory_budget_needs_cuda():
    with pytest.raises(ValueError, match="CUDA"):
        free_memory_budget(0.9, "cpu", 0)


@on_gpu
def test_cuda_fp8_copy_and_budget():
    spec = KVCacheSpec(2, 2, 8, "fp8", 16)
    kv = KVCacheTensors(spec, num_blocks=4, device="cuda")
    kv.key_caches[1][0] = 1.5
    kv.copy_blocks([(0, 3)])
    torch.cuda.synchronize()
    assert torch.all(kv.key_caches[1][3].float() == 1.5)
    total = torch.cuda.mem_get_info()[1]
    assert 0 < free_memory_budget(0.5, "cuda", 2**20) <= total // 2 - 2**20
