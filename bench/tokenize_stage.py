"""The router's tokenize stage alone, in one process: CPU per request of
``ModelTokenizer.prompt`` (chat template, prompt cache, encode, key, public part),
what ``bench.router_stages`` charges to ``tokenize``, without the HTTP load around it.

The prompts are ``bench.router_overhead``'s (``bench.overhead_load.prompts``): unique
2 KB texts, a repeated 2 KB document plus a question, 10-turn chats of ``n / 10``
conversations (every turn measured) and turn 10 alone of as many other conversations
(``bench.overhead_load.chat_turn10``), parsed as the router parses them. One model serves the
scenarios in that order, as one router process does. The garbage collector is set
as the router sets it (``router.server.serve.tune_gc``). Each request is timed with
``time.process_time`` (CPU, so other jobs on a shared machine count less than in
wall time); ``--repetitions`` runs everything again on a fresh model, and the table
shows the median of each scenario's per-run medians and means.

Run: ``python -m bench.tokenize_stage [--requests N] [--repetitions R] [--tokenizer NAME]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
from typing import Any

from bench.overhead_load import chat_turn10, prompts
from radix.model_source import load_tokenizer
from radix.openai.requests import CHAT, COMPLETIONS, OpenAIRequest, parse_openai_request
from router.config import ModelSpec
from router.models import ModelTokenizer
from router.server.serve import tune_gc

SCENARIOS = ("unique", "repeat", "chat", "chat_turn10")


def _requests(model: ModelTokenizer, scenario: str, n: int
              ) -> tuple[list[OpenAIRequest], list[OpenAIRequest]]:
    """(warm-up, measured) parsed requests of ``scenario``."""
    if scenario == "chat_turn10":
        warmup, measured = chat_turn10(n)
    else:
        measured = prompts(n, scenario)
        warmup = measured[:20]

    def parse(prompt: Any) -> OpenAIRequest:
        chat = isinstance(prompt, list)
        body = {"model": "demo", "messages" if chat else "prompt": prompt, "max_tokens": 16}
        return parse_openai_request(body, CHAT if chat else COMPLETIONS, model.bounds)

    return [parse(p) for p in warmup], [parse(p) for p in measured]


def _run(tokenizer: str, n: int) -> dict[str, tuple[float, float]]:
    """One sequence of the scenarios on a fresh model: (median, mean) CPU µs each."""
    model = ModelTokenizer(ModelSpec(name="demo", tokenizer=tokenizer), load_tokenizer(tokenizer))
    tune_gc()
    results = {}
    for scenario in SCENARIOS:
        warmup, measured = _requests(model, scenario, n)
        for request in warmup:
            model.prompt(request, "bench")
        times = []
        for request in measured:
            started = time.process_time()
            model.prompt(request, "bench")
            times.append(1e6 * (time.process_time() - started))
        results[scenario] = (statistics.median(times), statistics.fmean(times))
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the scenarios ``--repetitions`` times; print and return the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--tokenizer", default="SmolLM2-135M-Instruct")
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # as the router runs it
    thresholds = gc.get_threshold()
    try:
        runs = [_run(args.tokenizer, args.requests) for _ in range(args.repetitions)]
    finally:  # the caller's collector as it was
        gc.unfreeze()
        gc.set_threshold(*thresholds)
    table = {s: tuple(statistics.median(run[s][i] for run in runs) for i in (0, 1))
             for s in SCENARIOS}
    print(f"tokenize stage, CPU µs per request, median of {args.repetitions} runs, "
          f"tokenizer {args.tokenizer}")
    print(f"{'scenario':<12} {'median':>8} {'mean':>8}")
    for scenario, (median, mean) in table.items():
        print(f"{scenario:<12} {median:>8.0f} {mean:>8.0f}")
    return {"tokenizer": args.tokenizer, "median": table, "runs": runs}


if __name__ == "__main__":
    main()
