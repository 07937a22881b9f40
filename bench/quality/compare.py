"""Per-prompt comparison of a candidate against the baseline, and per-bucket summaries.

For each prompt the baseline decodes greedily (path ``b`` with distributions ``P``);
the candidate is forced along ``b`` (distributions ``Q``) and also decodes greedily
on its own. Along ``b``: top-1 agreement is the share of steps where ``argmax Q``
is the baseline's token, KL is the mean of ``KL(P || Q)`` per step, and the first
divergence is the first step whose ``argmax Q`` differs, which is exactly where the
candidate's own greedy output leaves ``b`` (the inputs are identical up to there).
Greedy exact match is whether the candidate's greedy output equals ``b``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from bench.quality.prompts import QualityPrompt
from bench.quality.session import Generation


@dataclass(frozen=True)
class PromptResult:
    """How one prompt compared. ``first_divergence`` is None when there was none."""

    prompt: QualityPrompt
    num_steps: int
    exact_match: bool
    first_divergence: int | None
    top1_agreement: float
    mean_kl: float
    baseline_contains: bool | None
    candidate_contains: bool | None


@dataclass(frozen=True)
class BucketSummary:
    """Aggregates over one prompt-length bucket (``must_contain`` rates over the prompts
    that check something; None when none does)."""

    bucket: str
    num_prompts: int
    exact_match_rate: float
    median_first_divergence: float | None
    top1_agreement: float
    mean_kl: float
    baseline_must_contain: float | None
    candidate_must_contain: float | None


def compare(
    prompt: QualityPrompt,
    baseline: Generation,
    forced: Generation,
    candidate: Generation,
    baseline_text: str,
    candidate_text: str,
) -> PromptResult:
    """One prompt's result (``forced`` is the candidate along the baseline's path)."""
    path = torch.tensor(baseline.token_ids)
    agree = forced.logprobs.argmax(-1) == path
    wrong = (~agree).nonzero()
    p = baseline.logprobs
    kl = (p.exp() * (p - forced.logprobs)).sum(-1).clamp(min=0)
    checks = prompt.must_contain_any
    return PromptResult(
        prompt=prompt,
        num_steps=len(path),
        exact_match=candidate.token_ids == baseline.token_ids,
        first_divergence=int(wrong[0]) if len(wrong) else None,
        top1_agreement=agree.float().mean().item(),
        mean_kl=kl.mean().item(),
        baseline_contains=any(s in baseline_text for s in checks) if checks else None,
        candidate_contains=any(s in candidate_text for s in checks) if checks else None,
    )


def summarize(results: Sequence[PromptResult]) -> list[BucketSummary]:
    """One summary per bucket (the prompt kind: ``short``, ``multi_turn``, ``long-1k``
    ...), in first-seen order, then ``all``."""
    buckets: dict[str, list[PromptResult]] = {}
    for result in results:
        buckets.setdefault(result.prompt.kind, []).append(result)
    buckets["all"] = list(results)
    return [_summary(name, rows) for name, rows in buckets.items() if rows]


def _summary(name: str, rows: list[PromptResult]) -> BucketSummary:
    divergences = [r.first_divergence for r in rows if r.first_divergence is not None]
    return BucketSummary(
        bucket=name,
        num_prompts=len(rows),
        exact_match_rate=sum(r.exact_match for r in rows) / len(rows),
        median_first_divergence=statistics.median(divergences) if divergences else None,
        top1_agreement=statistics.fmean(r.top1_agreement for r in rows),
        mean_kl=statistics.fmean(r.mean_kl for r in rows),
        baseline_must_contain=_rate([r.baseline_contains for r in rows]),
        candidate_must_contain=_rate([r.candidate_contains for r in rows]),
    )


def _rate(values: list[bool | None]) -> float | None:
    checked = [v for v in values if v is not None]
    return sum(checked) / len(checked) if checked else None

