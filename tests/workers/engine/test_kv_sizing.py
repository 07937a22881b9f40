"""Which rule sizes the KV cache: bytes on the CPU (configured or the default), and on
CUDA ``gpu_memory_utilization`` unless bytes are configured."""

from __future__ import annotations

import torch

from tests.support.gpu import on_gpu
from tests.workers.engine.engine_support import demo_model
from workers.build import kv_spec
from workers.config import DEFAULT_CACHE_BYTES, KVSettings, WorkerConfig
from workers.engine.kv_sizing import kv_budget


def test_the_cpu_uses_bytes_configured_or_the_default():
    loaded = demo_model()
    spec = kv_spec(loaded.config, 16)
    cpu = torch.device("cpu")
    assert kv_budget(WorkerConfig(), cpu, loaded.model, spec, 2048) == (
        DEFAULT_CACHE_BYTES, "kv_cache_bytes")
    configured = WorkerConfig(kv=KVSettings(cache_bytes=2**20))
    assert kv_budget(configured, cpu, loaded.model, spec, 2048) == (2**20, "kv_cache_bytes")


@on_gpu
def test_cuda_sizes_from_the_utilization_less_weights_and_peak_activation():
    from workers.model.demo import ensure_demo_checkpoint
    from workers.model.loader import load_model

    loaded = load_model(ensure_demo_checkpoint(), "cuda")
    spec = kv_spec(loaded.config, 16)
    config = WorkerConfig(kv=KVSettings(gpu_memory_utilization=0.5))
    budget = kv_budget(config, torch.device("cuda"), loaded.model, spec, 2048)
    total = torch.cuda.mem_get_info()[1]
    held = torch.cuda.memory_allocated()
    assert budget.rule.startswith("gpu_memory_utilization 0.5")
    assert 0 < budget.num_bytes < total // 2 - held
