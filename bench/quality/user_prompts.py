"""The user's own prompts for the quality gate (``--prompts FILE``): JSONL, one a line.

Each line is a JSON object with exactly one of ``prompt`` (a completion prompt,
tokenized as it is) and ``messages`` (a chat, ``[{"role": ..., "content": ...}]``,
through the model's chat template), and optionally ``expected`` (a string, or a list
of strings one of which a right answer contains: the prompt's task check),
``bucket`` (its verdict bucket, default ``user``) and ``id`` (default the line
number). Without ``expected`` the reference is the baseline's own answer, compared
token by token (exact match, top-1, KL). Blank lines are skipped. A line that breaks
any of this is refused with its line number (``PromptFileError``), before a model is
loaded; a prompt too long for the model's context, when the tokenizer sees it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from bench.quality.checks import Check
from bench.quality.prompts import CATEGORIES, QualityPrompt, encode
from radix.tokenizer import PromptTokenizer

USER_BUCKET = "user"
ROLES = ("system", "user", "assistant")
_FIELDS = ("prompt", "messages", "expected", "bucket", "id")


class PromptFileError(ValueError):
    """A prompt file the gate cannot use; the message names the file and the line."""


@dataclass(frozen=True)
class UserPrompt:
    """One line of the file: its number, id and bucket, the prompt (``text`` or
    ``messages``, the other None) and the check ``expected`` makes (None: the
    baseline's answer is the reference)."""

    line: int
    prompt_id: str
    bucket: str
    text: str | None
    messages: tuple[Mapping[str, str], ...] | None
    check: Check | None


@dataclass(frozen=True)
class UserPromptFile:
    """A read and validated prompt file, with the sha256 of its bytes."""

    path: Path
    sha256: str
    prompts: tuple[UserPrompt, ...]

    def quality_prompts(
        self, tokenizer: PromptTokenizer, max_prompt_tokens: int
    ) -> list[QualityPrompt]:
        """Each prompt tokenized, its id ``FILE:ID``; PromptFileError naming the line of
        a prompt the chat template refuses, or with no token, or longer than
        ``max_prompt_tokens`` (the model's context less the answer)."""
        prompts = []
        for p in self.prompts:
            where = f"{self.path} line {p.line}"
            try:
                ids = tokenizer.encode(p.text) if p.messages is None else encode(
                    tokenizer, p.messages)
            except ValueError as exc:
                raise PromptFileError(f"{where}: the chat template refuses it ({exc})") from exc
            if not ids or len(ids) > max_prompt_tokens:
                raise PromptFileError(f"{where}: {len(ids)} tokens; the model's context leaves "
                                      f"1 to {max_prompt_tokens} for a prompt")
            prompts.append(QualityPrompt(f"{self.path.name}:{p.prompt_id}", p.bucket,
                                         tuple(ids), p.check))
        return prompts


def read_user_prompts(path: Path) -> UserPromptFile:
    """The prompts of ``path``; PromptFileError, naming the line, for a malformed one, a
    repeated id, or a file without a prompt."""
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptFileError(f"{path}: cannot read it as UTF-8 text ({exc})") from exc
    prompts: list[UserPrompt] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            prompt = parse_line(line, number)
        except ValueError as exc:
            raise PromptFileError(f"{path} line {number}: {exc}") from exc
        if prompt.prompt_id in seen:
            raise PromptFileError(f"{path} line {number}: id {prompt.prompt_id!r} is taken by "
                                  f"line {seen[prompt.prompt_id]}")
        seen[prompt.prompt_id] = number
        prompts.append(prompt)
    if not prompts:
        raise PromptFileError(f"{path}: no prompt in it (one JSON object a line)")
    return UserPromptFile(path, hashlib.sha256(raw).hexdigest(), tuple(prompts))


def parse_line(line: str, number: int) -> UserPrompt:
    """The prompt on line ``number``; ValueError saying what is wrong with it."""
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(item, dict):
        raise ValueError(f"expected a JSON object, got {type(item).__name__}")
    unknown = sorted(set(item) - set(_FIELDS))
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r}; a line takes {', '.join(_FIELDS)}")
    if ("prompt" in item) == ("messages" in item):
        raise ValueError('needs exactly one of "prompt" and "messages"')
    text = _string(item, "prompt") if "prompt" in item else None
    messages = _messages(item["messages"]) if "messages" in item else None
    return UserPrompt(number, _string(item, "id", str(number)), _bucket(item), text, messages,
                      _expected(item.get("expected")))


def _string(item: Mapping[str, object], field: str, default: str | None = None) -> str:
    value = item.get(field, default)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f'"{field}" must be a non-empty string')
    return value


def _messages(value: object) -> tuple[Mapping[str, str], ...]:
    if not isinstance(value, list) or not value:
        raise ValueError('"messages" must be a non-empty list of {"role", "content"} objects')
    for index, message in enumerate(value):
        if (not isinstance(message, dict) or set(message) != {"role", "content"}
                or message["role"] not in ROLES or not isinstance(message["content"], str)):
            raise ValueError(f'messages[{index}] must be {{"role": one of {", ".join(ROLES)}, '
                             '"content": a string}')
    return tuple(value)


def _expected(value: object) -> Check | None:
    if value is None:
        return None
    answers = [value] if isinstance(value, str) else value
    if (not isinstance(answers, list) or not answers
            or not all(isinstance(a, str) and a for a in answers)):
        raise ValueError('"expected" must be a non-empty string or a list of them')
    return Check("contains", tuple(answers))


def _bucket(item: Mapping[str, object]) -> str:
    bucket = _string(item, "bucket", USER_BUCKET)
    if bucket in (*CATEGORIES, "all") or bucket.startswith("long-"):
        raise ValueError(f'"bucket" {bucket!r} is one of the gate\'s own buckets; name '
                         "another")
    return bucket

