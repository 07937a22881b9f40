"""The model runner and the engine on a CUDA GPU: decode steps against the HBM floor,
eager and replayed from CUDA graphs, kernels per step, and transformers beside them.

One run (a few minutes on an H200, most of it transformers' column):

1. builds a Llama-1B-shaped model with random weights on the device (16 layers,
   hidden 2,048, 32 query heads over 8 KV heads of 64, intermediate 8,192, vocabulary
   32,000, tied embeddings; bf16: 1.95 GiB), nothing downloaded;
2. checks that greedy decoding replayed from graphs gives the tokens eager decoding
   gives (batch 1: the same shapes, so the same kernels);
3. per decode batch (default 1, 32, 128), after a ``--prompt``-token prompt per
   sequence: ms per step through ``ModelRunner`` eager and with graphs, the bytes a
   step must read (weights + the batch's K/V) over its time as GB/s, the HBM floor
   (those bytes at ``--hbm-gbs``), the step's ratio to it, and the CUDA kernels one
   step runs (``torch.profiler``);
4. the same batches through the engine (scheduler, runner, sampler: ``Engine.step``)
   with graphs, ms per decode step;
5. transformers' ``generate`` on the same weights (``--no-transformers`` skips it):
   ms per decode step, prefill excluded.

Run from a plain checkout: ``PYTHONPATH=. python -m bench.gpu_engine [--json PATH]``.
``--device cpu`` with tiny shapes (``--layers 2 --hidden 64 --heads 4 --kv-heads 2
--intermediate 128 --vocab 320 --prompt 16 --batches 1,3 --steps 2``) is a smoke run
of the script's logic: graphs are replayed eagerly there and the timings mean nothing.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.gpu_timing import median_ms
from workers.model.config import ModelConfig
from workers.model.decode_graphs import CudaGraphCapture, EagerCapture
from workers.model.llama import LlamaForCausalLM
from workers.model.runner import GraphPlan, ModelRunner
from workers.model.step_input import StepInput

BLOCK_SIZE = 16
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options: the model's shape, the batches, the device."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--device", choices=("cuda", "cpu"), default="cuda")
    add("--dtype", choices=sorted(DTYPES), default="bfloat16")
    add("--layers", type=int, default=16)
    add("--hidden", type=int, default=2048)
    add("--heads", type=int, default=32)
    add("--kv-heads", type=int, default=8)
    add("--intermediate", type=int, default=8192)
    add("--vocab", type=int, default=32000)
    add("--prompt", type=int, default=512, help="prompt tokens per sequence")
    add("--batches", default="1,32,128", help="decode batch sizes")
    add("--steps", type=int, default=20, help="timed decode steps per measurement")
    add("--hbm-gbs", type=float, default=4800.0, help="HBM bandwidth of the device (H200: 4,800)")
    add("--no-transformers", action="store_true", help="skip transformers' column")
    add("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Build, check, time; print the table; return (and optionally save) the numbers."""
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench.gpu_engine needs a CUDA device (none found)")
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = build_model(args, device)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "weights_gib": round(weight_bytes / 2**30, 3),
        "greedy_graphs_equal_eager": graphs_match_eager(model, args, device),
        "runner": [time_runner(model, args, device, batch, weight_bytes)
                   for batch in args.batches],
        "engine": [time_engine(model, args, device, batch) for batch in args.batches],
        "transformers": [] if args.no_transformers else time_transformers(model, args, device),
    }
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return results


def build_model(args: argparse.Namespace, device: torch.device) -> LlamaForCausalLM:
    """The model shape of ``args`` with random weights (nn.Linear's init) on ``device``."""
    config = ModelConfig.from_dict({
        "architectures": ["LlamaForCausalLM"], "hidden_size": args.hidden,
        "intermediate_size": args.intermediate, "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads, "num_key_value_heads": args.kv_heads,
        "vocab_size": args.vocab, "max_position_embeddings": 8192, "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "torch_dtype": args.dtype,
    })
    with device:
        model = LlamaForCausalLM(config, DTYPES[args.dtype])
    if device.type == "cuda":
        model.merge_projections()  # as the loader does on CUDA
    return model.eval()


def max_model_len(args: argparse.Namespace) -> int:
    """Tokens a sequence may reach here: the prompt, every decode step the script
    takes (warm-ups, timed steps, the profiled step), and room to spare."""
    return args.prompt + 4 * args.steps + 64


def blocks_per_seq(args: argparse.Namespace) -> int:
    """Blocks of one sequence's table: ``max_model_len`` tokens, as wide as a graph's."""
    return -(-max_model_len(args) // BLOCK_SIZE)


def make_runner(model: LlamaForCausalLM, args: argparse.Namespace, device: torch.device,
                batch: int, graphs: bool) -> ModelRunner:
    """A runner over fresh caches for ``batch`` sequences; ``graphs``: decode steps
    replayed from captures."""
    num_blocks = batch * blocks_per_seq(args)
    config = model.config
    shape = (num_blocks, BLOCK_SIZE, config.num_key_value_heads, config.head_dim)
    dtype = DTYPES[args.dtype]
    keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
    values = [torch.zeros_like(k) for k in keys]
    plan = None
    if graphs:
        plan = GraphPlan(ReplayCounter(device), batch, max_model_len(args))
    return ModelRunner(model, keys, values, BLOCK_SIZE, graphs=plan)


class ReplayCounter:
    """CUDA graphs on CUDA (replayed eagerly elsewhere), counting replays."""

    def __init__(self, device: torch.device) -> None:
        self._capture = CudaGraphCapture() if device.type == "cuda" else EagerCapture()
        self.replays = 0

    def capture(self, step: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        """The inner capture's replay, counted."""
        replay = self._capture.capture(step)

        def counted() -> torch.Tensor:
            self.replays += 1
            return replay()

        return counted


class DecodeBatch:
    """``batch`` sequences with their prompts prefilled in ``runner``; ``step()`` decodes
    one greedy token for each."""

    def __init__(self, runner: ModelRunner, args: argparse.Namespace, batch: int) -> None:
        self.runner = runner
        per_seq, prompt = blocks_per_seq(args), args.prompt
        self.tables = [list(range(row * per_seq, (row + 1) * per_seq)) for row in range(batch)]
        self.lengths = [prompt] * batch
        generator = torch.Generator().manual_seed(1)
        vocab = runner.model.config.vocab_size
        prompts = torch.randint(0, vocab, (batch, prompt), generator=generator).tolist()
        logits = runner.execute([StepInput(p, 0, t) for p, t in zip(prompts, self.tables,
                                                                     strict=True)])
        self.tokens = logits.argmax(-1).tolist()

    def next_batch(self) -> list[StepInput]:
        """The next decode step's inputs."""
        return [StepInput([token], length, table) for token, length, table
                in zip(self.tokens, self.lengths, self.tables, strict=True)]

    def replays(self) -> bool:
        """Whether the runner replays the next step from its graphs."""
        graphs = self.runner.graphs
        return graphs is not None and graphs.runs(self.next_batch())

    def step(self) -> list[int]:
        """Decode one token per sequence (greedy); returns the tokens."""
        self.tokens = self.runner.execute(self.next_batch()).argmax(-1).tolist()
        self.lengths = [length + 1 for length in self.lengths]
        return self.tokens


def graphs_match_eager(model: LlamaForCausalLM, args: argparse.Namespace,
                       device: torch.device) -> bool:
    """Whether 16 greedy tokens at batch 1 are the same replayed and eager."""
    outputs = []
    for graphs in (False, True):
        decode = DecodeBatch(make_runner(model, args, device, 1, graphs), args, 1)
        if decode.replays() != graphs:
            raise SystemExit(f"bench.gpu_engine: graphs {'not ' if graphs else ''}replayed")
        outputs.append([decode.step()[0] for _ in range(16)])
    return outputs[0] == outputs[1]


def time_runner(model: LlamaForCausalLM, args: argparse.Namespace, device: torch.device,
                batch: int, weight_bytes: int) -> dict[str, Any]:
    """One batch's decode step, eager and with graphs, against the HBM floor."""
    config = model.config
    kv_bytes = (2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
                * DTYPES[args.dtype].itemsize * batch * (args.prompt + args.steps))
    floor_ms = (weight_bytes + kv_bytes) / (args.hbm_gbs * 1e9) * 1e3
    row: dict[str, Any] = {"batch": batch, "floor_ms": round(floor_ms, 4)}
    for mode, graphs in (("eager", False), ("graphs", True)):
        decode = DecodeBatch(make_runner(model, args, device, batch, graphs), args, batch)
        replays = decode.replays()
        ms = median_ms(decode.step, args.steps)
        row[mode] = {
            "replayed": replays,
            "ms": ms,
            "tokens_per_s": round(batch / ms * 1e3),
            "read_gbs": round((weight_bytes + kv_bytes) / (ms * 1e6)),
            "x_floor": round(ms / floor_ms, 1),
            "kernels": kernels_per_step(decode.step, device),
        }
        del decode
    return row


def kernels_per_step(step: Any, device: torch.device) -> int | None:
    """CUDA kernels (and copies) one call of ``step`` runs, from ``torch.profiler``."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    return sum(1 for event in prof.events() if event.device_type.name == "CUDA")


def time_engine(model: LlamaForCausalLM, args: argparse.Namespace, device: torch.device,
                batch: int) -> dict[str, Any]:
    """ms per decode step of ``batch`` requests through ``Engine.step`` (graphs on)."""
    from prometheus_client import CollectorRegistry

    from radix.tokenizer import PromptTokenizer
    from workers.build import kv_spec
    from workers.config import EngineConfig
    from workers.engine.engine import Engine
    from workers.engine.metrics import EngineMetrics
    from workers.engine.request import GenerationParams, GenerationRequest
    from workers.kv.build import build_kv_cache_manager
    from workers.model.sampler import SamplingParams

    spec = kv_spec(model.config, BLOCK_SIZE)
    num_blocks = batch * blocks_per_seq(args) + 16
    manager = build_kv_cache_manager(spec, num_blocks, namespace_digest=b"gpu-engine",
                                     worker_id="gpu-engine", device=device,
                                     secret=b"gpu-engine")
    capture = ReplayCounter(device)
    runner = ModelRunner(model, manager.tensors.key_caches, manager.tensors.value_caches,
                         BLOCK_SIZE, graphs=GraphPlan(capture, batch, max_model_len(args)))
    config = EngineConfig(max_batched_tokens=max(args.prompt * batch, 2048), max_num_seqs=batch)
    engine = Engine(manager, runner, PromptTokenizer.demo(), config, max_model_len(args),
                    EngineMetrics(CollectorRegistry()))
    generator = torch.Generator().manual_seed(2)
    sampling = SamplingParams(temperature=0, max_tokens=3 * args.steps + 8, ignore_eos=True)
    for request_id in range(batch):
        prompt = torch.randint(0, model.config.vocab_size, (args.prompt,), generator=generator)
        engine.add_request(request_id, GenerationRequest(tuple(prompt.tolist()),
                                                         GenerationParams(sampling)))
    for _ in range(4):  # prefill (one step at these sizes) and warm-up decode steps
        engine.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start, replays = time.perf_counter(), capture.replays
    for _ in range(args.steps):
        engine.step()
    ms = (time.perf_counter() - start) / args.steps * 1e3
    return {"batch": batch, "ms": round(ms, 4), "tokens_per_s": round(batch / ms * 1e3),
            "replayed_steps": capture.replays - replays}


def time_transformers(model: LlamaForCausalLM, args: argparse.Namespace,
                      device: torch.device) -> list[dict[str, Any]]:
    """transformers' greedy ``generate`` on the same weights: ms per decode step."""
    import transformers

    config = model.config
    hf_config = transformers.LlamaConfig(
        hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, vocab_size=config.vocab_size,
        max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True)
    with device:
        hf = transformers.LlamaForCausalLM(hf_config).to(DTYPES[args.dtype]).eval()
    missing = hf.load_state_dict(model.state_dict(), strict=False).missing_keys
    if missing:
        raise SystemExit(f"bench.gpu_engine: transformers' model lacks weights {missing[:3]}")
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    rows = []
    for batch in args.batches:
        prompts = torch.randint(0, config.vocab_size, (batch, args.prompt), device=device)
        generate_s(hf, prompts, 2)  # warm-up
        one, many = generate_s(hf, prompts, 1), generate_s(hf, prompts, args.steps + 1)
        rows.append({"batch": batch, "ms": round((many - one) / args.steps * 1e3, 4)})
    return rows


def generate_s(hf: torch.nn.Module, prompts: torch.Tensor, num_tokens: int) -> float:
    """Seconds of one greedy ``generate`` of ``num_tokens`` tokens per prompt."""
    cuda = prompts.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.inference_mode():
        hf.generate(prompts, max_new_tokens=num_tokens, do_sample=False)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def print_table(results: dict[str, Any]) -> None:
    """The decode table: one row per batch (``replayed``: graphed steps replayed a graph;
    ``engine replays``: the engine's timed steps that did)."""
    print(f"device: {results['device']}; weights {results['weights_gib']} GiB; greedy tokens "
          f"with graphs == eager: {results['greedy_graphs_equal_eager']}")
    hf = {row["batch"]: row["ms"] for row in results["transformers"]}
    engine = {row["batch"]: row for row in results["engine"]}
    print("| batch | floor ms | eager ms | kernels | graphs ms | kernels | replayed | "
          "graphs x floor | graphs read GB/s | engine ms | engine replays | transformers ms |")
    print("|---:|---:|---:|---:|---:|---:|:--:|---:|---:|---:|---:|---:|")
    for row in results["runner"]:
        eager, graphs = row["eager"], row["graphs"]
        step = engine.get(row["batch"], {})
        print(f"| {row['batch']} | {row['floor_ms']} | {eager['ms']} | {eager['kernels']} | "
              f"{graphs['ms']} | {graphs['kernels']} | {graphs['replayed']} | "
              f"{graphs['x_floor']} | {graphs['read_gbs']} | {step.get('ms', '-')} | "
              f"{step.get('replayed_steps', '-')} | {hf.get(row['batch'], '-')} |")


if __name__ == "__main__":
    main()
