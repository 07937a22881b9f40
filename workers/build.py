"""Assemble a worker's engine from its configuration: model, KV plan, namespace.

Order: load the checkpoint (``demo`` is written once, then loaded like any other; a
packaged model's GGUF is found in its installed distribution) or take a timed
profile (``workers.model.timed``: the profile's KV shape and budget, no weights),
plan the KV cache from the byte budget, derive the cache namespace and its digest
under the deployment secret, build the KV manager (radix or null prefix cache),
the model runner, the engine and its thread bridge, and the metrics registry.
With ``--enable-lora`` the adapter slots are allocated beside the KV pool (a real
model's weights, or a timed profile's waits) and the start-up adapters registered
(``workers.lora.service``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from prometheus_client import CollectorRegistry, ProcessCollector

from radix.cost_model import Profile
from radix.model_source import DEMO_MODEL, resolve_model_path
from radix.namespace import CacheNamespace
from radix.tokenizer import PromptTokenizer
from radix.version import project_version
from workers.config import EngineConfig, KVSettings, WorkerConfig
from workers.engine.async_engine import AsyncEngine
from workers.engine.engine import Engine
from workers.engine.kv_feed import KVEventFeed
from workers.engine.kv_sizing import KVBudget, kv_budget
from workers.engine.metrics import EngineMetrics, register_stats
from workers.kv.build import build_kv_cache_manager
from workers.kv.fp8_device import fp8_device_problem
from workers.kv.manager import KVCacheManager
from workers.kv.plan import KVCachePlan, describe, plan_kv_cache
from workers.kv.scales import KVScales, load_scales
from workers.kv.spec import KVCacheSpec
from workers.kv.tensors import KV_LAYOUT_VERSION, KVCacheTensors
from workers.kv.tiers.core_dumps import disable_core_dumps
from workers.lora.adapters import SlotLoader
from workers.lora.peft_files import BaseShapes
from workers.lora.service import LoraService, build_lora
from workers.lora.weights import LoraWeights
from workers.model.config import ModelConfig
from workers.model.decode_graphs import CudaGraphCapture
from workers.model.demo import demo_config, ensure_demo_checkpoint
from workers.model.loader import load_model
from workers.model.numerics import EngineNumerics
from workers.model.runner import GraphPlan, ModelRunner
from workers.model.timed import (
    TimedRunner,
    TimedSlotLoader,
    profile_digest,
    timed_kv_spec,
    timed_lora_shapes,
    timed_profile,
    timed_tensor_spec,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerIdentity:
    """What a worker serves and how its KV cache is laid out (``/ready``, ``/info``).

    ``max_model_len`` is the longest sequence (prompt + output) accepted: the model's
    limit, the configured cap and the KV capacity, whichever is smallest.
    ``served_model_names`` are the names requests may use; responses carry the first
    (``model``). ``model_source`` is the model argument as given (``demo``, a packaged
    name or a path). ``engine_version`` is the project's version (``radix.version``),
    ``attention_backend`` the kernels that write and read the KV blocks, and
    ``decode_graph_sizes`` the batch sizes whose decode steps replay CUDA graphs (empty:
    every step eager).
    """

    worker_id: str
    epoch: str
    served_model_names: tuple[str, ...]
    model_source: str
    namespace: CacheNamespace
    namespace_digest: str
    max_model_len: int
    vocab_size: int
    kv_plan: KVCachePlan
    kv_scales: KVScales
    engine_version: str
    attention_backend: str
    decode_graph_sizes: tuple[int, ...] = ()

    @property
    def model(self) -> str:
        """The name responses carry: the first served name."""
        return self.served_model_names[0]

    def to_dict(self) -> dict[str, object]:
        """The identity fields shared by ``/ready`` and ``/info``."""
        return {
            "worker_id": self.worker_id,
            "epoch": self.epoch,
            "model": self.model,
            "served_model_names": list(self.served_model_names),
            "namespace": self.namespace.to_dict(),
            "namespace_digest": self.namespace_digest,
            "tokenizer_digest": self.namespace.tokenizer_digest,
            "block_size": self.namespace.block_size,
            "kv_dtype": self.namespace.kv_dtype,
            "kv_scales": self.kv_scales.describe(),
            "num_total_blocks": self.kv_plan.num_blocks,
            "max_model_len": self.max_model_len,
            "engine_version": self.engine_version,
            "attention_backend": self.attention_backend,
            "decode_graph_sizes": list(self.decode_graph_sizes),
        }

    def kv_plan_dict(self) -> dict[str, object]:
        """The KV plan for ``/info``."""
        plan = self.kv_plan
        return {
            "kv_cache_bytes": plan.kv_cache_bytes,
            "kv_cache_bytes_used": plan.kv_cache_bytes_used,
            "kv_bytes_per_token": plan.kv_bytes_per_token,
            "num_blocks": plan.num_blocks,
            "num_tokens": plan.num_tokens,
            "block_size": plan.spec.block_size,
            "kv_dtype": plan.spec.dtype,
            "sizing_rule": plan.sizing_rule,
        }


@dataclass(frozen=True)
class BuiltWorker:
    """Everything the HTTP layer serves from (the engine thread is not started)."""

    identity: WorkerIdentity
    engine: AsyncEngine
    tokenizer: PromptTokenizer
    registry: CollectorRegistry
    engine_config: EngineConfig
    prefix_cache: bool
    lora: LoraService


@dataclass(frozen=True)
class _Backend:
    """What the engine needs from a model, whether a checkpoint or a timed profile:
    identity (tokenizer, digest, RoPE), KV layout and budget, the runner factory, and
    what adapters must fit and their slots (``loader``, None without ``--enable-lora``;
    ``needs_weights`` False: config-only adapters are accepted)."""

    tokenizer: PromptTokenizer
    weights_digest: str
    rope: dict[str, object]
    vocab_size: int
    max_positions: int
    spec: KVCacheSpec
    tensor_spec: KVCacheSpec
    kv_budget: KVBudget
    make_runner: Callable[[KVCacheTensors, KVScales, SlotLoader | None, int],
                          ModelRunner | TimedRunner]
    source: str
    lora_shapes: BaseShapes | None
    loader: SlotLoader | None
    needs_weights: bool


def _checkpoint_backend(config: WorkerConfig, device: torch.device) -> _Backend:
    name = config.model.name
    path = ensure_demo_checkpoint() if name == DEMO_MODEL else resolve_model_path(name)
    loaded = load_model(path, device)
    model_config = loaded.config
    spec = kv_spec(model_config, config.kv.block_size, config.kv.cache_dtype)
    dtype = loaded.model.lm_head.weight.dtype
    shapes = BaseShapes.llama(
        model_config.num_hidden_layers, model_config.hidden_size, model_config.intermediate_size,
        model_config.num_attention_heads, model_config.num_key_value_heads,
        model_config.head_dim, dtype.itemsize)
    # The slots before the KV budget: on CUDA it is what memory torch does not hold yet.
    slots = (LoraWeights(shapes, config.lora.max_loras, config.lora.max_lora_rank, dtype, device)
             if config.lora.enable else None)

    graphs = decode_graphs(config, device)

    def make_runner(tensors: KVCacheTensors, scales: KVScales, loader: SlotLoader | None,
                    max_model_len: int) -> ModelRunner:
        lora = loader if isinstance(loader, LoraWeights) else None
        plan = None if graphs is None else GraphPlan(
            graphs, config.engine.max_num_seqs, max_model_len)
        try:
            return ModelRunner(loaded.model, tensors.key_caches, tensors.value_caches,
                               spec.block_size, scales, lora, plan)
        except RuntimeError as exc:  # torch's errors while capturing are RuntimeErrors
            if plan is None:
                raise
            raise ValueError(f"capturing decode steps in CUDA graphs failed ({exc}); "
                             "--enforce-eager runs them without graphs") from exc

    return _Backend(
        loaded.tokenizer, loaded.weights_digest, model_config.rope_fingerprint(),
        model_config.vocab_size, model_config.max_position_embeddings, spec, spec,
        kv_budget(config, device, loaded.model, spec, model_config.max_position_embeddings,
                  graphs is not None),
        make_runner, str(path), shapes, slots, True)


def _timed_backend(profile: Profile, config: WorkerConfig) -> _Backend:
    """The profile's shape and KV budget (``kv.cache_bytes`` is the profile's memory
    left for KV, not the flag; ``kv.timed_cache_bytes`` when set), the demo tokenizer,
    outputs over its letters."""
    tokenizer = PromptTokenizer.demo()
    budget = KVBudget(config.kv.timed_cache_bytes or profile.kv_cache_bytes, "timed profile")
    letters = tokenizer.encode("abcdefghijklmnopqrstuvwxyz", add_special_tokens=False)
    vocab_size = demo_config()["vocab_size"]
    rope = {"rope_theta": profile.rope_theta, "rope_scaling": None,
            "max_position_embeddings": profile.max_model_len}
    spec = timed_kv_spec(profile, config.kv.block_size)
    return _Backend(
        tokenizer, profile_digest(profile), rope, vocab_size, profile.max_model_len, spec,
        timed_tensor_spec(config.kv.block_size), budget,
        lambda tensors, scales, loader, max_model_len: TimedRunner(profile.cost, vocab_size, letters,
                                                    time_scale=config.model.time_scale),
        f"timed profile {profile.name} ({profile.model})", timed_lora_shapes(profile),
        TimedSlotLoader(profile, config.model.time_scale) if config.lora.enable else None,
        False)


def build_worker(config: WorkerConfig, worker_id: str, secret: bytes) -> BuiltWorker:
    """Load the model (or the timed profile) and build the engine; raises ValueError on
    a bad model or plan."""
    device = _device(config.model.device)
    if config.model.num_threads is not None:
        torch.set_num_threads(config.model.num_threads)
    profile = timed_profile(config.model.name)
    backend = (_checkpoint_backend(config, device) if profile is None
               else _timed_backend(profile, config))
    served_names = config.model.served_names
    spec = backend.spec
    plan = plan_kv_cache(spec, backend.kv_budget.num_bytes, sizing_rule=backend.kv_budget.rule)
    check_fp8_device(spec, device)
    scales = kv_scales(spec, config.kv, backend.weights_digest)
    numerics = EngineNumerics.on(device, config.model.numerics_version)
    namespace = cache_namespace(served_names[0], backend.weights_digest, backend.tokenizer,
                                backend.rope, spec, scales, numerics)
    digest = namespace.digest(secret)
    manager = _kv_cache_manager(config, backend, plan, digest, worker_id, device, secret)
    model_limit = backend.max_positions
    max_model_len = min(config.model.max_model_len or model_limit, model_limit, plan.num_tokens)
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)  # process_*: resident memory, CPU, descriptors
    lora = build_lora(config.lora, backend.lora_shapes, backend.loader, backend.needs_weights,
                      namespace, secret, registry)
    runner = backend.make_runner(manager.tensors, scales, backend.loader, max_model_len)
    engine = Engine(manager, runner, backend.tokenizer, config.engine, max_model_len,
                    EngineMetrics(registry), lora.slots, spec.dtype)
    max_in_flight = config.engine.max_num_seqs + config.engine.max_waiting_requests
    async_engine = AsyncEngine(engine, KVEventFeed(manager), max_in_flight)
    register_stats(registry, lambda: async_engine.stats)
    identity = WorkerIdentity(
        worker_id=worker_id,
        epoch=manager.event_log.epoch,
        served_model_names=served_names,
        model_source=config.model.name,
        namespace=namespace,
        namespace_digest=digest.hex(),
        max_model_len=max_model_len,
        vocab_size=backend.vocab_size,
        kv_plan=plan,
        kv_scales=scales,
        engine_version=project_version(),
        attention_backend=numerics.attention_backend,
        decode_graph_sizes=(runner.graphs.sizes if isinstance(runner, ModelRunner)
                            and runner.graphs is not None else ()),
    )
    _log_plan(identity, backend.source, device, config,
              manager.stats().host.num_host_blocks_total)
    return BuiltWorker(identity, async_engine, backend.tokenizer, registry, config.engine,
                       config.kv.prefix_cache, lora)


def _kv_cache_manager(config: WorkerConfig, backend: _Backend, plan: KVCachePlan,
                      digest: bytes, worker_id: str, device: torch.device,
                      secret: bytes) -> KVCacheManager:
    """The KV cache manager of ``plan``'s blocks, with the host and disk tiers the
    config sizes; a process holding host blocks is marked not dumpable (a warning
    when it cannot be)."""
    spec = backend.spec
    num_host_blocks = _tier_blocks("host_cache_bytes", config.kv.host_cache_bytes, spec)
    num_disk_blocks = _tier_blocks("disk_cache_bytes", config.kv.disk_cache_bytes, spec)
    manager = build_kv_cache_manager(
        backend.tensor_spec, plan.num_blocks, namespace_digest=digest, worker_id=worker_id,
        device=device, prefix_caching=config.kv.prefix_cache,
        hash_algorithm=config.kv.hash_algorithm, max_events=config.kv.event_log_size,
        num_host_blocks=num_host_blocks, secret=secret, watermark=config.kv.watermark,
        host_ttl_s=config.kv.host_ttl_s, num_disk_blocks=num_disk_blocks,
        disk_dir=None if config.kv.disk_cache_dir is None else Path(config.kv.disk_cache_dir),
    )
    if num_host_blocks and not disable_core_dumps():
        log.warning("host KV tier on, but the process could not be marked not dumpable")
    if num_disk_blocks:
        log.info("disk KV tier: %d blocks in %s (AES-256-GCM), %d taken back from a previous "
                 "run", num_disk_blocks, config.kv.disk_cache_dir,
                 manager.stats().disk.num_disk_blocks_used)
    return manager


def _tier_blocks(field: str, num_bytes: int, spec: KVCacheSpec) -> int:
    """Whole blocks in a tier of ``num_bytes``; ValueError when a non-zero size holds
    none."""
    num_blocks = num_bytes // spec.kv_bytes_per_block
    if num_bytes and not num_blocks:
        raise ValueError(f"kv.{field}={num_bytes} holds no block of "
                         f"{spec.kv_bytes_per_block} bytes")
    return num_blocks


def _log_plan(identity: WorkerIdentity, source: str, device: torch.device,
              config: WorkerConfig, num_host_blocks: int) -> None:
    log.info("model %s from %s on %s (max_model_len %d)", ", ".join(identity.served_model_names),
             source, device, identity.max_model_len)
    log.info("KV plan:\n%s", describe(identity.kv_plan, None))
    log.info("KV cache dtype %s, scales: %s", identity.kv_plan.spec.dtype,
             identity.kv_scales.describe())
    ttl = config.kv.host_ttl_s
    log.info("host KV tier: %s", f"{num_host_blocks} blocks (AES-256-GCM, TTL "
             f"{'none' if ttl is None else f'{ttl:g} s'}, core dumps off)" if num_host_blocks
             else "off")
    log.info("namespace fingerprint %s (prefix cache %s)", identity.namespace_digest,
             "on" if config.kv.prefix_cache else "off")
    log.info("decode steps: %s", f"replayed from CUDA graphs at batch sizes "
             f"{list(identity.decode_graph_sizes)}" if identity.decode_graph_sizes else "eager")


def cache_namespace(
    served_name: str, weights_digest: str, tokenizer: PromptTokenizer,
    rope: Mapping[str, object], spec: KVCacheSpec, scales: KVScales, numerics: EngineNumerics,
) -> CacheNamespace:
    """What makes this worker's KV blocks mean what they mean (no adapter yet): the
    KV dtype and, for FP8, the scale file's digest are part of it, and so are the
    kernels that write the blocks and their numerics version."""
    return CacheNamespace(
        model_id=served_name,
        weights_digest=weights_digest,
        tokenizer_digest=tokenizer.digest,
        rope=CacheNamespace.canonical_rope(rope),
        kv_dtype=spec.dtype,
        block_size=spec.block_size,
        kv_scales_digest=scales.digest,
        kv_layout_version=KV_LAYOUT_VERSION,
        attention_backend=numerics.attention_backend,
        engine_numerics_version=numerics.version,
    )


def kv_spec(model_config: ModelConfig, block_size: int, cache_dtype: str = "auto") -> KVCacheSpec:
    """The KV block layout of a model: its layers, KV heads, head dim, and the cache
    dtype (``auto``: the model's)."""
    model_dtype = str(model_config.dtype).removeprefix("torch.")
    return KVCacheSpec(
        num_layers=model_config.num_hidden_layers,
        num_kv_heads=model_config.num_key_value_heads,
        head_dim=model_config.head_dim,
        dtype=model_dtype if cache_dtype == "auto" else cache_dtype,
        block_size=block_size,
    )


def kv_scales(spec: KVCacheSpec, kv: KVSettings, weights_digest: str) -> KVScales:
    """The cache's scales: from ``kv.scales_file`` for FP8, else unit. An FP8 cache
    without a file is a ValueError unless ``kv.allow_unit_scales`` (then a warning:
    values beyond the format's range saturate)."""
    if kv.scales_file is not None:
        return load_scales(kv.scales_file, spec.dtype, spec.num_layers, spec.num_kv_heads,
                           spec.head_dim, weights_digest)
    if spec.is_fp8 and not kv.allow_unit_scales:
        raise ValueError(f"KV cache dtype {spec.dtype} needs a scales file (--kv-scales, from "
                         "python -m workers.model.calibrate); --allow-unit-kv-scales starts "
                         "it with every scale 1.0")
    if spec.is_fp8:
        log.warning("KV cache dtype %s without a scales file: unit scales, allowed by "
                    "--allow-unit-kv-scales", spec.dtype)
    return KVScales.unit(spec.num_layers)


def check_fp8_device(spec: KVCacheSpec, device: torch.device) -> None:
    """ValueError when ``device`` is a GPU that cannot hold ``spec``'s FP8 cache
    (``workers.kv.fp8_device``); nothing for other caches and devices."""
    if spec.is_fp8 and device.type == "cuda":
        problem = fp8_device_problem(spec.dtype, torch.cuda.get_device_capability(device))
        if problem is not None:
            raise ValueError(problem)


def decode_graphs(config: WorkerConfig, device: torch.device) -> CudaGraphCapture | None:
    """How decode steps are captured: CUDA graphs on CUDA unless ``enforce_eager``;
    None (every step eager) elsewhere."""
    if device.type != "cuda" or config.model.enforce_eager:
        return None
    return CudaGraphCapture()


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("model.device is 'cuda' but no CUDA device is available")
    return torch.device(name)
