"""LoRA adapters in the engine against transformers + peft on a tiny Llama checkpoint:
greedy outputs per adapter (with a prefix hit that ends mid-block), one namespace per
adapter (no hit across adapters nor with the base model), mixed batches, and slot
swaps, loads and unloads under traffic with the KV invariants checked every step."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import torch
from peft import PeftModel
from prometheus_client import CollectorRegistry
from transformers import LlamaForCausalLM

from harness.lora_adapters import model_shapes, write_peft_adapter
from radix.namespace import CacheNamespace
from tests.workers.model.hf_checkpoints import hf_greedy, random_prompt, write_hf_checkpoint
from workers.build import build_worker, kv_spec
from workers.config import EngineConfig, KVSettings, LoraSettings, WorkerConfig
from workers.engine.engine import Engine
from workers.engine.metrics import EngineMetrics
from workers.engine.request import GenerationParams, GenerationRequest
from workers.kv.build import build_kv_cache_manager
from workers.lora.adapters import AdapterSlots
from workers.lora.peft_files import read_adapter
from workers.lora.service import adapter_namespace
from workers.lora.weights import LoraWeights
from workers.model.decode_graphs import EagerCapture
from workers.model.demo import ensure_demo_checkpoint
from workers.model.loader import load_model
from workers.model.runner import GraphPlan, ModelRunner
from workers.model.sampler import SamplingParams
from workers.server.streaming import collect

BLOCK_SIZE = 16
MAX_RANK = 8
NUM_TOKENS = 6
# name -> (rank, alpha, targets, rsLoRA): every projection, attention only, MLP only.
ADAPTERS = {
    "alpha": (4, 8, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
              False),
    "beta": (8, 4, ("q_proj", "v_proj", "o_proj"), True),
    "gamma": (2, 4, ("gate_proj", "up_proj", "down_proj"), False),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """The tiny checkpoint and one real random PEFT adapter per entry of ADAPTERS."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("lora")
    model_dir = root / "model"
    write_hf_checkpoint(model_dir, "llama-gqa")
    paths = {name: write_peft_adapter(root / name, model_dir, rank, alpha, seed, targets, rslora)
             for seed, (name, (rank, alpha, targets, rslora)) in enumerate(ADAPTERS.items())}
    return model_dir, paths


@pytest.fixture(scope="module")
def reference(checkpoint):
    """``reference(adapter or None, prompt)``: transformers (+ peft) greedy tokens."""
    model_dir, paths = checkpoint
    models = {None: LlamaForCausalLM.from_pretrained(model_dir).eval()}
    for name, path in paths.items():
        models[name] = PeftModel.from_pretrained(
            LlamaForCausalLM.from_pretrained(model_dir), str(path)).eval()
    return lambda adapter, prompt: hf_greedy(models[adapter], prompt, NUM_TOKENS)


def lora_engine(checkpoint, max_loras: int, num_blocks: int = 64, max_num_seqs: int = 64,
                graphs: GraphPlan | None = None) -> Engine:
    """An engine over the checkpoint with every adapter registered in ``max_loras`` slots
    (decode steps replayed through ``graphs`` when given)."""
    model_dir, paths = checkpoint
    loaded = load_model(model_dir)
    spec = kv_spec(loaded.config, BLOCK_SIZE)
    base = CacheNamespace("tiny", loaded.weights_digest, loaded.tokenizer.digest)
    manager = build_kv_cache_manager(spec, num_blocks, namespace_digest=base.digest(b"s"),
                                     worker_id="lora-test", secret=b"s")
    shapes = model_shapes(model_dir)
    weights = LoraWeights(shapes, max_loras, MAX_RANK, torch.float32, "cpu")
    slots = AdapterSlots(max_loras, weights, lambda s: adapter_namespace(base, s).digest(b"s"))
    for name, path in paths.items():
        slots.register(read_adapter(name, path, shapes, MAX_RANK))
    runner = ModelRunner(loaded.model, manager.tensors.key_caches, manager.tensors.value_caches,
                         BLOCK_SIZE, lora=weights, graphs=graphs)
    config = EngineConfig(max_num_seqs=max_num_seqs)
    return Engine(manager, runner, loaded.tokenizer, config, 256,
                  EngineMetrics(CollectorRegistry()), slots)


class ReplayCounter(EagerCapture):
    """An eager capture that counts replays."""

    def __init__(self) -> None:
        self.replays = 0

    def capture(self, step):
        def replay():
            self.replays += 1
            return step()

        return replay


def prompt_ids(length: int, seed: int) -> list[int]:
    """A random prompt without token 0, which ``hf_greedy``'s ``generate`` takes for
    padding and masks."""
    return [token or 1 for token in random_prompt(length, seed)]


def greedy(prompt, adapter: str | None) -> GenerationRequest:
    params = SamplingParams(temperature=0.0, max_tokens=NUM_TOKENS, ignore_eos=True)
    return GenerationRequest(tuple(prompt), GenerationParams(params), adapter=adapter)


def run(engine: Engine, requests: dict[int, GenerationRequest], on_step=None) -> dict:
    """Run ``requests`` together to the end: ``{id: (token ids, cached tokens)}``,
    checking the KV and slot invariants after every step."""
    for request_id, request in requests.items():
        engine.add_request(request_id, request)
    tokens: dict[int, list[int]] = {request_id: [] for request_id in requests}
    results = {}
    while engine.has_work():
        for request_id, output in engine.step().items():
            assert output.error is None, output.error
            tokens[request_id].extend(t for d in output.deltas for t in d.token_ids)
            if output.usage is not None:
                results[request_id] = (tokens[request_id], output.usage.cached_tokens)
        engine.manager.check_invariants()
        engine.adapters.check_invariants()
        if on_step is not None:
            on_step(engine)
    return results


def test_each_adapter_is_exact_against_peft_with_a_mid_block_prefix_hit(checkpoint, reference):
    engine = lora_engine(checkpoint, max_loras=2)
    first = prompt_ids(40, seed=1)
    second = first[:27] + prompt_ids(9, seed=2)  # shares 27 tokens: a hit ending mid-block
    request_ids = itertools.count()
    for adapter in [*ADAPTERS, None]:
        (tokens, cached), = run(engine, {next(request_ids): greedy(first, adapter)}).values()
        assert tokens == reference(adapter, first), adapter
        assert cached == 0, adapter
        (tokens, cached), = run(engine, {next(request_ids): greedy(second, adapter)}).values()
        assert tokens == reference(adapter, second), adapter
        assert cached == 27, adapter
    assert engine.adapters.num_loads == 3  # two slots for three adapters: one was evicted


def test_the_same_prompt_under_another_adapter_or_the_base_model_hits_nothing(checkpoint):
    engine = lora_engine(checkpoint, max_loras=2)
    prompt = prompt_ids(50, seed=3)
    cached = [run(engine, {i: greedy(prompt, adapter)})[i][1]
              for i, adapter in enumerate(["alpha", "beta", None, "alpha", "beta", None])]
    assert cached[:3] == [0, 0, 0]
    assert cached[3:] == [49, 49, 49]
    log = engine.manager.event_log
    stored = {event.namespace for event in log.since(0, log.epoch) if event.type == "stored"}
    assert len(stored) == 3
    _, snapshot = engine.manager.snapshot()
    assert [event.type for event in snapshot].count("cleared") == 1
    assert {event.namespace for event in snapshot if event.type == "stored"} == stored


@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "decode-graphs"])
def test_a_batch_mixing_two_adapters_and_the_base_model_is_exact(checkpoint, reference, graphs):
    # With graphs, decode steps replay the bucket's step function over static buffers
    # (EagerCapture: the function a CUDA graph records), each row its own adapter run.
    capture = ReplayCounter()
    engine = lora_engine(checkpoint, max_loras=2,
                         graphs=GraphPlan(capture, 8, 256) if graphs else None)
    prompts = {i: prompt_ids(20 + 7 * i, seed=10 + i) for i in range(6)}
    adapters = ["alpha", None, "beta", "beta", None, "alpha"]
    batch_sizes = []
    results = run(engine, {i: greedy(prompts[i], adapters[i]) for i in prompts},
                  lambda e: batch_sizes.append(len(e.scheduler.running)))
    for i, adapter in enumerate(adapters):
        assert results[i][0] == reference(adapter, prompts[i]), (i, adapter)
    assert max(batch_sizes) == 6  # all six ran in the same steps
    assert capture.replays == (NUM_TOKENS - 1 if graphs else 0)  # every decode step


def test_swaps_loads_and_unloads_under_traffic_lose_no_request_and_leak_no_block(checkpoint):
    engine = lora_engine(checkpoint, max_loras=1, num_blocks=24, max_num_seqs=3)
    adapters = ["alpha", "beta", "gamma", None] * 4
    requests = {i: greedy(prompt_ids(18 + i, seed=20 + i), a) for i, a in enumerate(adapters)}
    alone = {i: run(lora_engine(checkpoint, max_loras=3), {i: r})[i][0]
             for i, r in requests.items() if i < 4}

    def unload_gamma_midway(e: Engine) -> None:
        if e.adapters.num_loads == 3 and "gamma" in {a.name for a in e.adapters.published}:
            e.adapters.unregister("gamma")  # its queued requests still run

    results = run(engine, requests, unload_gamma_midway)
    assert sorted(results) == sorted(requests)
    for i in alone:
        assert results[i][0] == alone[i]
    assert engine.adapters.num_loads > 3  # one slot: adapters were swapped in and out
    assert "gamma" not in {a.name for a in engine.adapters.published}
    engine.manager.evict(engine.manager.pool.num_total_blocks)
    assert engine.manager.num_free_blocks == engine.manager.pool.num_total_blocks


def test_a_worker_built_from_its_config_serves_the_adapter_exactly(tmp_path):
    """The whole wiring (config, build_worker, slots beside the KV pool, the runner's
    deltas) on the demo checkpoint: ``adapter`` requests equal transformers + peft."""
    model_dir = ensure_demo_checkpoint()
    path = write_peft_adapter(tmp_path / "demo-lora", model_dir, 8, 16, seed=7)
    config = WorkerConfig(kv=KVSettings(cache_bytes=2 * 2**20), lora=LoraSettings(
        enable=True, modules=(f"demo-lora={path}",), max_lora_rank=8))
    built = build_worker(config, "w", b"secret")
    prompt = prompt_ids(30, seed=5)

    async def main() -> list[list[int]]:
        built.engine.start(asyncio.get_running_loop())
        try:
            return [(await collect(built.engine, greedy(prompt, adapter), 60))[0][0].token_ids
                    for adapter in ("demo-lora", None)]
        finally:
            built.engine.stop()

    with_adapter, base = asyncio.run(main())
    hf_model = LlamaForCausalLM.from_pretrained(model_dir).eval()
    assert base == hf_greedy(hf_model, prompt, NUM_TOKENS)
    assert with_adapter == hf_greedy(PeftModel.from_pretrained(hf_model, str(path)).eval(), prompt,
                                     NUM_TOKENS)
    assert with_adapter != base
    assert [a.resident for a in built.lora.slots.published] == [True]


def test_an_adapter_whose_files_broke_after_registration_fails_its_request_alone(checkpoint,
                                                                                 tmp_path):
    model_dir, paths = checkpoint
    engine = lora_engine(checkpoint, max_loras=1)
    broken = write_peft_adapter(tmp_path / "broken", model_dir, 2, 4, seed=9)
    engine.adapters.register(read_adapter("broken", broken, model_shapes(model_dir), MAX_RANK))
    (broken / "adapter_model.safetensors").write_bytes(b"not safetensors")
    engine.add_request(0, greedy(prompt_ids(20, seed=30), "broken"))
    engine.add_request(1, greedy(prompt_ids(20, seed=31), None))
    last = {}
    while engine.has_work():
        last.update(engine.step())
        engine.manager.check_invariants()
    assert last[0].error is not None and last[0].usage is None
    assert last[1].error is None and last[1].usage is not None
    assert "broken" not in {a.name for a in engine.adapters.published}
    assert engine.adapters.num_resident == 0
