"""The quality harness's prompt set: short QA, multi-turn chats, long-context retrieval.

Short and multi-turn prompts are shipped in ``prompts.json`` (chat messages and
``must_contain_any``: the answer passes when it contains one of these strings; an
empty list checks nothing). Long prompts are built here, deterministically, from
generated documents: records of made-up warehouses padded to about 1K, 4K and 8K
tokens of the model under test, with one fact (a vault's access code) buried at a
seeded position and a question about it at the end.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from radix.tokenizer import PromptTokenizer

PROMPTS_FILE = Path(__file__).with_name("prompts.json")
LONG_TARGETS = {"1k": 1024, "4k": 4096, "8k": 8192}
_CITIES = ["Oslo", "Lima", "Perth", "Dakar", "Quito", "Hanoi", "Riga", "Tunis", "Cork", "Leon"]
_GOODS = ["copper wire", "oak planks", "glass jars", "wool coats", "steel bolts", "rice sacks"]


@dataclass(frozen=True)
class QualityPrompt:
    """One prompt: its token ids, its kind (``short``, ``multi_turn``, ``long-1k`` ...)
    and the strings one of which a correct answer contains (empty: not checked)."""

    prompt_id: str
    kind: str
    token_ids: tuple[int, ...]
    must_contain_any: tuple[str, ...]


def load_prompt_set(
    tokenizer: PromptTokenizer,
    long_kinds: Sequence[str],
    max_prompt_tokens: int,
    per_kind: int | None = None,
) -> list[QualityPrompt]:
    """The shipped prompts (the first ``per_kind`` of each kind; None: all) plus one
    long retrieval prompt per kind in ``long_kinds`` (keys of ``LONG_TARGETS``);
    prompts longer than ``max_prompt_tokens`` are left out."""
    data = json.loads(PROMPTS_FILE.read_text(encoding="utf-8"))
    prompts = [
        QualityPrompt(item["id"], kind, tuple(encode(tokenizer, item["messages"])),
                      tuple(item["must_contain_any"]))
        for kind in ("short", "multi_turn")
        for item in data[kind][:per_kind]
    ]  # fmt: skip
    for kind in long_kinds:
        prompts.append(long_prompt(tokenizer, kind, LONG_TARGETS[kind]))
    return [p for p in prompts if len(p.token_ids) <= max_prompt_tokens]


def long_prompt(tokenizer: PromptTokenizer, kind: str, num_tokens: int) -> QualityPrompt:
    """A generated document of about ``num_tokens`` tokens with one buried fact."""
    rng = random.Random(f"quality-{kind}")
    code = str(rng.randrange(1000, 10000))
    question = "What is the access code of the vault in the Lima warehouse? Answer with the code."
    fact = f"The access code of the vault in the Lima warehouse is {code}."
    records: list[str] = []
    budget = num_tokens - len(encode(tokenizer, [_message(fact, question)]))
    while len(tokenizer.encode(" ".join(records), add_special_tokens=False)) < budget:
        records.append(_record(rng, len(records)))
    records.insert(rng.randrange(len(records) // 4, 3 * len(records) // 4 + 1), fact)
    token_ids = encode(tokenizer, [_message(" ".join(records), question)])
    return QualityPrompt(f"retrieval-{kind}", f"long-{kind}", tuple(token_ids), (code,))


def encode(tokenizer: PromptTokenizer, messages: Sequence[dict[str, str]]) -> list[int]:
    """Chat-template token ids; a tokenizer without a template gets the contents joined."""
    if tokenizer.chat_template:
        return tokenizer.encode_chat(messages)
    return tokenizer.encode("\n".join(m["content"] for m in messages) + "\n")


def _message(document: str, question: str) -> dict[str, str]:
    return {"role": "user", "content": f"Read the records below.\n\n{document}\n\n{question}"}


def _record(rng: random.Random, index: int) -> str:
    city = rng.choice([c for c in _CITIES if c != "Lima"])
    goods = rng.choice(_GOODS)
    return (f"Record {index}: the {city} warehouse holds {rng.randrange(10, 999)} crates of "
            f"{goods} in aisle {rng.randrange(1, 40)}, checked on day {rng.randrange(1, 365)}.")
