"""The embedded default model (SmolLM2-135M-Instruct, its packaged Q4_1 GGUF) on the
CPU: a worker process against transformers on the same dequantized weights, same run.

Each of the chat questions goes through a real worker as a streamed ``/generate``
(greedy, ``--decode-tokens`` tokens, EOS ignored): TTFT is the time to the first
token event, decode tokens/s is ``(tokens - 1) / (end - first token)``. The worker's
prefix cache holds the template's shared system prompt after the first question, as
it would in service. transformers runs ``generate`` on the same token ids: TTFT is
``generate(max_new_tokens=1)``, decode is ``(t(N) - t(1)) / (N - 1)``. Both use
``--threads`` torch threads (default 1: on a shared machine OpenMP threads that wait for a
descheduled sibling make both columns erratic). The greedy tokens of both are compared.

Run: ``python -m bench.smollm2_bench [--decode-tokens N] [--threads N]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import aiohttp
import torch

from bench.e2e_worker_bench import one_request
from harness.procs import start_worker
from radix.model_source import load_tokenizer, packaged_model_path

MODEL = "SmolLM2-135M-Instruct"
QUESTIONS = (
    "What is the capital of France?",
    "What is the capital of Germany?",
    "Name three primary colors.",
    "Why is the sky blue? Answer in one sentence.",
    "Write a haiku about the sea.",
)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the comparison, print its table, return the numbers (or why it was skipped)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        path = packaged_model_path(MODEL)
    except ValueError as exc:
        print(f"skipped: {exc}")
        return {"skipped": str(exc)}
    tokenizer = load_tokenizer(MODEL)
    prompts = [tokenizer.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
    ours = _worker_runs(prompts, args)
    theirs = _transformers_runs(path, prompts, args)
    same = sum(a["token_ids"] == b["token_ids"] for a, b in zip(ours, theirs, strict=True))
    results = {
        "threads": args.threads,
        "decode_tokens": args.decode_tokens,
        "prompt_tokens": [len(p) for p in prompts],
        "ours": _summary(ours),
        "transformers": _summary(theirs),
        "greedy_equal": f"{same}/{len(prompts)}",
        "answer": tokenizer.decode(_until_eos(ours[0]["token_ids"], tokenizer.eos_token_ids)),
    }
    o, t = results["ours"], results["transformers"]
    print(f"{'':14} {'TTFT p50 ms':>12} {'decode tok/s':>13}")
    print(f"{'worker':14} {o['ttft_p50_ms']:>12.1f} {o['decode_tokens_per_s']:>13.1f}")
    print(f"{'transformers':14} {t['ttft_p50_ms']:>12.1f} {t['decode_tokens_per_s']:>13.1f}")
    print(f"decode ratio {o['decode_tokens_per_s'] / t['decode_tokens_per_s']:.2f}x, "
          f"greedy tokens equal on {same}/{len(prompts)} prompts; "
          f"{QUESTIONS[0]!r} -> {results['answer']!r}")
    return results


def _worker_runs(prompts: list[list[int]], args: argparse.Namespace) -> list[dict[str, Any]]:
    worker = start_worker("--model", MODEL, "--num-threads", str(args.threads),
                          kv_cache_bytes="128MiB", timeout_s=300)
    try:
        return asyncio.run(_stream_all(worker.url, prompts, args.decode_tokens))
    finally:
        worker.stop()


async def _stream_all(url: str, prompts: list[list[int]], num_tokens: int) -> list[dict[str, Any]]:
    runs = []
    async with aiohttp.ClientSession() as session:
        for prompt in prompts:
            started = time.perf_counter()
            ttft, token_ids = await one_request(session, url, prompt, num_tokens)
            total = time.perf_counter() - started
            runs.append({"ttft_s": ttft, "decode_s": total - ttft, "token_ids": token_ids})
    return runs


def _transformers_runs(path, prompts: list[list[int]], args: argparse.Namespace) -> list[dict]:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                 dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    runs = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            started = time.perf_counter()
            model.generate(ids, max_new_tokens=1, do_sample=False)
            ttft = time.perf_counter() - started
            started = time.perf_counter()
            out = model.generate(ids, max_new_tokens=args.decode_tokens, do_sample=False)
            total = time.perf_counter() - started
        runs.append({"ttft_s": ttft, "decode_s": total - ttft,
                     "token_ids": out[0, len(prompt):].tolist()})
    return runs


def _until_eos(token_ids: list[int], eos_ids: tuple[int, ...]) -> list[int]:
    """The tokens before the first EOS (the runs ignore EOS to time a fixed length)."""
    ends = [i for i, token in enumerate(token_ids) if token in eos_ids]
    return token_ids[: ends[0]] if ends else token_ids


def _summary(runs: list[dict[str, Any]]) -> dict[str, float]:
    tokens = len(runs[0]["token_ids"]) - 1
    return {
        "ttft_p50_ms": round(statistics.median(r["ttft_s"] for r in runs) * 1e3, 1),
        "decode_tokens_per_s": round(tokens * len(runs) / sum(r["decode_s"] for r in runs), 1),
    }


if __name__ == "__main__":
    main()
