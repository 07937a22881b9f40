"""The router's prefix token cache on repeating prompts: hit rate and time saved.

Workloads, on a real BPE (SmolLM2's, from its GGUF; the demo tokenizer's bytes when
the package is absent), with text made of the tokenizer's own whole-word tokens
drawn by Zipf frequency (no data set download):

- ``rag``: 40 documents of about 4,000 characters, Zipf(1.0) popularity, each
  request a document plus a unique question (completions text);
- ``chat``: 60 conversations of 10 turns, interleaved at random, each turn the whole
  history rendered with the chat template plus a new user message;
- ``unique``: 2,000-character prompts that never repeat (the cache's overhead).

Each request is encoded by a plain ``encode`` and through the cache (one tenant);
the ids are checked equal, and the table shows mean µs per request of each, their
ratio and the share of characters the cache reused. Tokenizer thread parallelism
is off, as in the router.

Run: ``python -m bench.token_cache_bench [--requests N]``.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

from radix.model_source import DEMO_MODEL, load_tokenizer, packaged_model_path
from radix.token_cache import PrefixTokenCache
from radix.tokenizer import PromptTokenizer
from radix.tree import Scope

SCOPE = Scope("tenant")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run every workload, print the table, return the numbers."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600)
    args = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # as the router runs it
    name = "SmolLM2-135M-Instruct"
    try:
        packaged_model_path(name)
    except ValueError:
        name = DEMO_MODEL
    tokenizer = load_tokenizer(name)
    words = _words(tokenizer)
    workloads = {
        "rag": lambda rng: _rag(rng, words),
        "chat": lambda rng: _chat(rng, words),
        "unique": lambda rng: _unique(rng, words),
    }
    results: dict[str, Any] = {"tokenizer": name}
    print(f"tokenizer {name}")
    print(f"{'workload':8} {'requests':>8} {'chars':>7} {'encode µs':>10} {'cached µs':>10} "
          f"{'ratio':>6} {'reused':>7}")
    for label, make in workloads.items():
        row = _run(tokenizer, make(random.Random(0)), args.requests)
        results[label] = row
        print(f"{label:8} {row['requests']:>8} {row['mean_chars']:>7} {row['encode_us']:>10.0f} "
              f"{row['cached_us']:>10.0f} {row['encode_us'] / row['cached_us']:>5.1f}x "
              f"{row['reused_fraction']:>6.0%}")
    return results


def _run(tokenizer: PromptTokenizer, requests: Iterator[Callable[[Any], list[int]]],
         num_requests: int) -> dict[str, Any]:
    cache = PrefixTokenCache(tokenizer)
    scoped = cache.scoped(SCOPE)
    plain_s = cached_s = 0.0
    for _, encode in zip(range(num_requests), requests, strict=False):
        started = time.perf_counter()
        expected = encode(tokenizer)
        plain_s += time.perf_counter() - started
        started = time.perf_counter()
        got = encode(scoped)
        cached_s += time.perf_counter() - started
        if got != expected:
            raise AssertionError("the token cache changed an encoding")
    stats = cache.stats()
    num_chars = stats.num_chars
    return {
        "requests": num_requests,
        "mean_chars": num_chars // num_requests,
        "encode_us": plain_s / num_requests * 1e6,
        "cached_us": cached_s / num_requests * 1e6,
        "reused_fraction": stats.num_reused_chars / max(1, num_chars),
    }


def _words(tokenizer: PromptTokenizer) -> list[str]:
    """Whole-word tokens of the vocabulary (byte-level 'Ġword'), most frequent first;
    plain lowercase words for a byte tokenizer."""
    vocab = tokenizer.vocabulary()
    words = [t[1:] for t in sorted(vocab, key=vocab.__getitem__)
             if t.startswith("Ġ") and t[1:].isalpha() and t[1:].isascii()]
    if len(words) < 500:
        rng = random.Random(1)
        words = ["".join(rng.choice("etaoinshrdlucmfwyp") for _ in range(rng.randint(2, 9)))
                 for _ in range(3000)]
    return words[:5000]


def _text(rng: random.Random, words: list[str], num_chars: int) -> str:
    out: list[str] = []
    size = 0
    while size < num_chars:
        word = words[min(len(words) - 1, int(rng.paretovariate(1.0)) - 1)]
        if rng.random() < 0.08:
            word += rng.choice(".,;:?!")
        out.append(word)
        size += len(word) + 1
    return " ".join(out)


def _rag(rng: random.Random, words: list[str]) -> Iterator[Callable[[Any], list[int]]]:
    documents = [_text(rng, words, 4000) for _ in range(40)]
    weights = [1 / (rank + 1) for rank in range(len(documents))]
    while True:
        prompt = (rng.choices(documents, weights)[0] + "\n\nQuestion: "
                  + _text(rng, words, 80) + "?\nAnswer:")
        yield lambda encoder, prompt=prompt: encoder.encode(prompt)


def _chat(rng: random.Random, words: list[str]) -> Iterator[Callable[[Any], list[int]]]:
    conversations: list[list[dict[str, str]]] = [[] for _ in range(60)]
    while True:
        messages = rng.choice(conversations)
        if len(messages) >= 20:
            messages.clear()
        messages.append({"role": "user", "content": _text(rng, words, 150)})
        turn = list(messages)
        yield lambda encoder, turn=turn: encoder.encode_chat(turn)
        messages.append({"role": "assistant", "content": _text(rng, words, 300)})


def _unique(rng: random.Random, words: list[str]) -> Iterator[Callable[[Any], list[int]]]:
    while True:
        prompt = _text(rng, words, 2000)
        yield lambda encoder, prompt=prompt: encoder.encode(prompt)


if __name__ == "__main__":
    main()
