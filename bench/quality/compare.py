"""Per-prompt comparison of a candidate against the baseline, and per-bucket summaries.

For each prompt the baseline decodes greedily (path ``b`` with distributions ``P``);
the candidate is forced along ``b`` (distributions ``Q``) and also decodes greedily
on its own. Along ``b``: top-1 agreement is the share of steps where ``argmax Q``
is the baseline's token, KL is the mean of ``KL(P || Q)`` per step, and the first
divergence is the first step whose ``argmax Q`` differs, which is exactly where the
candidate's own greedy output leaves ``b`` (the inputs are identical up to there).
Greedy exact match is whether the candidate's greedy output equals ``b``. The task
check (``bench.quality.checks``) gives each answer a decision: the candidate agrees
when its decision is the baseline's, and each decision is scored right or wrong.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from bench.quality.checks import correct, decision
from bench.quality.prompts import QualityPrompt
from bench.quality.session import Generation


@dataclass(frozen=True)
class PromptResult:
    """How one prompt compared. ``first_divergence`` is None when there was none; the
    decisions and their scores are None when the prompt checks nothing."""

    prompt: QualityPrompt
    num_steps: int
    exact_match: bool
    first_divergence: int | None
    top1_agreement: float
    mean_kl: float
    baseline_decision: str | None
    candidate_decision: str | None
    baseline_correct: bool | None
    candidate_correct: bool | None

    @property
    def same_decision(self) -> bool | None:
        """Whether the candidate decided as the baseline did (None: nothing checked)."""
        if self.baseline_decision is None:
            return None
        return self.candidate_decision == self.baseline_decision


@dataclass(frozen=True)
class BucketSummary:
    """Aggregates over one bucket (a category or a long-context length). The decision
    and task-score rates are over the prompts that check something (None when none
    does)."""

    bucket: str
    num_prompts: int
    exact_match_rate: float
    median_first_divergence: float | None
    top1_agreement: float
    mean_kl: float
    same_decision: float | None
    baseline_correct: float | None
    candidate_correct: float | None


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
    made = decision(prompt.check, baseline_text), decision(prompt.check, candidate_text)
    return PromptResult(
        prompt=prompt,
        num_steps=len(path),
        exact_match=candidate.token_ids == baseline.token_ids,
        first_divergence=int(wrong[0]) if len(wrong) else None,
        top1_agreement=agree.float().mean().item(),
        mean_kl=kl.mean().item(),
        baseline_decision=made[0],
        candidate_decision=made[1],
        baseline_correct=correct(prompt.check, made[0]),
        candidate_correct=correct(prompt.check, made[1]),
    )


def summarize(results: Sequence[PromptResult]) -> list[BucketSummary]:
    """One summary per bucket (the prompt kind: ``short``, ``tool_call``, ``long-1k``
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
        same_decision=_rate([r.same_decision for r in rows]),
        baseline_correct=_rate([r.baseline_correct for r in rows]),
        candidate_correct=_rate([r.candidate_correct for r in rows]),
    )


def _rate(values: list[bool | None]) -> float | None:
    checked = [v for v in values if v is not None]
    return sum(checked) / len(checked) if checked else None
