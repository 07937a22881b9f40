"""The quality harness's prompt set: one category per task type, plus long context.

``prompts.json`` ships the categories in ``CATEGORIES`` (chat messages and a task
``check``, see ``bench.quality.checks``). Long prompts are built here,
deterministically: for each length (about 1K and 4K tokens, and ``max``: the longest
prompt that leaves room for the answer in the model's context) one generated
document of made-up warehouse records with a needle (a vault's access code, each in
another city) at each depth of ``DEPTHS``, and one prompt per needle: the same
document, then a question about that needle. The prompts of a length share the
document, so after the first the prefix cache holds it, as in a RAG deployment.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.quality.checks import Check
from radix.tokenizer import PromptTokenizer

PROMPTS_FILE = Path(__file__).with_name("prompts.json")
CATEGORIES = ("short", "multi_turn", "tool_call", "rag", "refusal", "format")
LONG_TARGETS = {"1k": 1024, "4k": 4096, "8k": 8192, "max": 0}
DEPTHS = (0.05, 0.25, 0.5, 0.75, 0.95)
_NEEDLE_CITIES = ("Lima", "Bergen", "Cusco", "Nantes", "Tromso", "Arles", "Bilbao", "Malmo")
_CITIES = ("Oslo", "Perth", "Dakar", "Quito", "Hanoi", "Riga", "Tunis", "Cork", "Leon")
_GOODS = ("copper wire", "oak planks", "glass jars", "wool coats", "steel bolts", "rice sacks")


@dataclass(frozen=True)
class QualityPrompt:
    """One prompt: its token ids, its kind (a category, or ``long-1k`` ...) and its
    task check (None: nothing checked beyond the token-level metrics)."""

    prompt_id: str
    kind: str
    token_ids: tuple[int, ...]
    check: Check | None


def load_prompt_set(
    tokenizer: PromptTokenizer,
    long_kinds: Sequence[str],
    max_prompt_tokens: int,
    per_kind: int | None = None,
    depths: Sequence[float] = DEPTHS,
) -> list[QualityPrompt]:
    """The shipped prompts (the first ``per_kind`` of each category; None: all), then
    the long prompts of each length in ``long_kinds`` (keys of ``LONG_TARGETS``) with
    needles at ``depths``; prompts longer than ``max_prompt_tokens`` are left out."""
    data = json.loads(PROMPTS_FILE.read_text(encoding="utf-8"))
    prompts = [
        QualityPrompt(item["id"], kind, tuple(encode(tokenizer, item["messages"])),
                      Check.from_json(item["check"]))
        for kind in CATEGORIES
        for item in data[kind][:per_kind]
    ]
    for kind in long_kinds:
        target = LONG_TARGETS[kind] or max_prompt_tokens
        if target <= max_prompt_tokens:
            prompts += needle_prompts(tokenizer, kind, target, depths)
    return [p for p in prompts if len(p.token_ids) <= max_prompt_tokens]


def needle_prompts(
    tokenizer: PromptTokenizer, kind: str, num_tokens: int, depths: Sequence[float]
) -> list[QualityPrompt]:
    """One document of at most ``num_tokens`` prompt tokens (with the longest question)
    holding a needle at each of ``depths``, and a prompt per needle asking for it."""
    if len(depths) > len(_NEEDLE_CITIES):
        raise ValueError(f"at most {len(_NEEDLE_CITIES)} depths")
    rng = random.Random(f"quality-{kind}")
    cities = _NEEDLE_CITIES[: len(depths)]
    needles = [(city, str(rng.randrange(1000, 10000))) for city in cities]
    records = [_record(rng, i) for i in range(num_tokens)]
    count = _fit(tokenizer, records, needles, depths, num_tokens)
    document = _document(records[:count], needles, depths)
    return [
        QualityPrompt(f"needle-{kind}-d{round(depth * 100):02d}", f"long-{kind}",
                      tuple(encode(tokenizer, [_message(document, city)])),
                      Check("contains", (code,)))
        for depth, (city, code) in zip(depths, needles, strict=True)
    ]


def encode(tokenizer: PromptTokenizer, messages: Sequence[dict[str, str]]) -> list[int]:
    """Chat-template token ids; a tokenizer without a template gets the contents joined."""
    if tokenizer.chat_template:
        return tokenizer.encode_chat(messages)
    return tokenizer.encode("\n".join(m["content"] for m in messages) + "\n")


def _fit(
    tokenizer: PromptTokenizer,
    records: list[str],
    needles: list[tuple[str, str]],
    depths: Sequence[float],
    num_tokens: int,
) -> int:
    """How many filler records make the longest prompt at most ``num_tokens`` tokens:
    an estimate from the records' own lengths, then corrected on the real prompt."""
    longest = max((city for city, _ in needles), key=len)
    overhead = len(encode(tokenizer, [_message(_document([], needles, depths), longest)]))
    total, count = overhead, 0
    while total < num_tokens and count < len(records):
        total += len(tokenizer.encode(records[count] + " ", add_special_tokens=False))
        count += 1

    def size(n: int) -> int:
        return len(encode(tokenizer, [_message(_document(records[:n], needles, depths), longest)]))

    while count > 0 and size(count) > num_tokens:
        count -= 1
    return count


def _document(records: list[str], needles: list[tuple[str, str]], depths: Sequence[float]) -> str:
    """The records with each needle inserted at its depth (a share of the records)."""
    placed = list(records)
    for depth, (city, code) in sorted(zip(depths, needles, strict=True), reverse=True):
        fact = f"The access code of the vault in the {city} warehouse is {code}."
        placed.insert(round(depth * len(records)), fact)
    return " ".join(placed)


def _message(document: str, city: str) -> dict[str, str]:
    question = (
        f"What is the access code of the vault in the {city} warehouse? Answer with the code."
    )
    return {"role": "user", "content": f"Read the records below.\n\n{document}\n\n{question}"}


def _record(rng: random.Random, index: int) -> str:
    city = rng.choice(_CITIES)
    goods = rng.choice(_GOODS)
    return (
        f"Record {index}: the {city} warehouse holds {rng.randrange(10, 999)} crates of "
        f"{goods} in aisle {rng.randrange(1, 40)}, checked on day {rng.randrange(1, 365)}."
    )
