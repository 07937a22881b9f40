"""What an answer decided, per task category, and whether that decision is right.

Each prompt carries a ``Check``. ``decision`` reduces an answer's text to one short
string (the function a tool call names, the document ids an answer cites, refuse or
answer, the answer's line structure, whether it contains the expected string); the
gate compares the candidate's decision with the baseline's, so the categories mean
something even on a model with random weights. ``correct`` scores a decision against
the prompt's expected value, which is a real task score on a real model.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

KINDS = ("contains", "tool_call", "citation", "refusal", "format")
INVALID_JSON = "invalid-json"
_CITATION = re.compile(r"doc-\d+")
_REFUSAL = re.compile(
    r"\b(I can(?:no|')t|I cannot|I'm sorry|I am sorry|I'm unable|I am unable|I won't|"
    r"I will not|I'm not able|I am not able|not appropriate|can(?:no|')t (?:help|assist))",
    re.IGNORECASE,
)
_NUMBERED = re.compile(r"\d+[.)]\s")


@dataclass(frozen=True)
class Check:
    """A prompt's task check: ``kind`` (one of ``KINDS``) and ``expected`` (the strings
    one of which a right answer contains; the function name; the document id;
    ``refuse`` or ``answer``; the line kind the answer must use)."""

    kind: str
    expected: tuple[str, ...]

    @classmethod
    def from_json(cls, data: dict[str, object]) -> Check | None:
        """The check of a ``prompts.json`` item (``{"tool_call": "get_weather"}``; an
        empty object or an empty ``contains`` list checks nothing: None)."""
        if not data:
            return None
        ((kind, value),) = data.items()
        if kind not in KINDS:
            raise ValueError(f"unknown check {kind!r}, expected one of {KINDS}")
        if kind == "refusal":
            value = "refuse" if value else "answer"
        expected = tuple(value) if isinstance(value, list) else (str(value),)
        return cls(kind, expected) if expected else None


def decision(check: Check | None, text: str) -> str | None:
    """The decision ``text`` makes under ``check`` (None when nothing is checked)."""
    if check is None:
        return None
    if check.kind == "contains":
        return "contains" if any(s in text for s in check.expected) else "absent"
    if check.kind == "tool_call":
        return _tool_call(text)
    if check.kind == "citation":
        return "cites:" + ",".join(sorted(set(_CITATION.findall(text))))
    if check.kind == "refusal":
        return "refuse" if _REFUSAL.search(text) else "answer"
    return ",".join(_line_kinds(text))


def correct(check: Check | None, made: str | None) -> bool | None:
    """Whether decision ``made`` is the right one for ``check`` (None: not checked)."""
    if check is None or made is None:
        return None
    if check.kind == "contains":
        return made == "contains"
    if check.kind == "tool_call":
        return made == f"call:{check.expected[0]}"
    if check.kind == "citation":
        return check.expected[0] in made.removeprefix("cites:").split(",")
    if check.kind == "refusal":
        return made == check.expected[0]
    return check.expected[0] in made.split(",")


def _tool_call(text: str) -> str:
    """``call:<name>`` for the first JSON object in ``text`` that parses and names a
    function (``name``, or ``function``/``function.name``), else ``invalid-json``."""
    start = text.find("{")
    while start != -1:
        try:
            value, _ = json.JSONDecoder().raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        name = value.get("name") if isinstance(value, dict) else None
        function = value.get("function") if isinstance(value, dict) else None
        if name is None and isinstance(function, dict):
            name = function.get("name")
        elif name is None:
            name = function
        return f"call:{name}" if isinstance(name, str) else INVALID_JSON
    return INVALID_JSON


def _line_kinds(text: str) -> list[str]:
    """The answer's blocks: each non-empty line's kind (``fence``, ``code`` inside a
    fence, ``bullet``, ``number``, ``heading`` or ``text``), a run of lines of one kind
    counted once (how many items a list has is content, not structure)."""
    kinds = []
    fenced = False
    for line in (raw.strip() for raw in text.splitlines()):
        if line.startswith("```"):
            fenced = not fenced
            kinds.append("fence")
        elif not line:
            continue
        elif fenced:
            kinds.append("code")
        elif line[0] in "-*•":
            kinds.append("bullet")
        elif _NUMBERED.match(line):
            kinds.append("number")
        else:
            kinds.append("heading" if line.startswith("#") else "text")
    return [kind for i, kind in enumerate(kinds) if i == 0 or kind != kinds[i - 1]]
