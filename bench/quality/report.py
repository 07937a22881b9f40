"""The quality gate's verdict per category, against the noise floor, and its report."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.quality.compare import BucketSummary, PromptResult
from bench.quality.paths import PathRun


@dataclass(frozen=True)
class Thresholds:
    """What the candidate must meet in every bucket (a category or a long-context
    length), each against that bucket's own noise floor (the baseline rerun).
    Greedy exact match of a category (long buckets excepted: their answers are a few
    tokens after thousands) may fall at most ``max_exact_match_drop`` below the
    floor's; top-1 agreement >= ``min_top1`` and mean KL <= ``max_kl``; the share of
    task decisions equal to the baseline's may fall at most ``max_decision_drop``
    below the floor's, and the task score (right decisions) at most
    ``max_score_drop`` more than the floor's own loss against the baseline.
    ``require_exact``: greedy exact match everywhere (a change that must not alter
    any answer)."""

    max_exact_match_drop: float = 0.5
    min_top1: float = 0.9
    max_kl: float = 0.05
    max_decision_drop: float = 0.0
    max_score_drop: float = 0.0
    require_exact: bool = False


def verdict(
    candidate: Sequence[BucketSummary], noise: Sequence[BucketSummary], limits: Thresholds
) -> dict[str, list[str]]:
    """Each bucket's failed checks, one line each (an empty list: the bucket passes);
    the ``all`` row is not judged."""
    floor = {s.bucket: s for s in noise}
    return {s.bucket: _failures(s, floor[s.bucket], limits) for s in candidate if s.bucket != "all"}


def _failures(s: BucketSummary, n: BucketSummary, limits: Thresholds) -> list[str]:
    failures = []
    if limits.require_exact and s.exact_match_rate < 1.0:
        failures.append(f"greedy exact match {s.exact_match_rate:.0%}, need 100%")
    drop = n.exact_match_rate - s.exact_match_rate
    if not s.bucket.startswith("long-") and drop > limits.max_exact_match_drop + 1e-9:
        failures.append(f"exact match {s.exact_match_rate:.0%}, {drop:.0%} below the noise "
                        f"floor (allowed {limits.max_exact_match_drop:.0%})")
    if s.top1_agreement < limits.min_top1:
        failures.append(f"top-1 agreement {s.top1_agreement:.3f} < {limits.min_top1}")
    if s.mean_kl > limits.max_kl:
        failures.append(f"mean KL {s.mean_kl:.4f} > {limits.max_kl}")
    if s.same_decision is not None and n.same_decision is not None:
        drop = n.same_decision - s.same_decision
        if drop > limits.max_decision_drop + 1e-9:
            failures.append(f"same decision as the baseline {s.same_decision:.0%}, noise "
                            f"floor {n.same_decision:.0%}")
    if s.baseline_correct is not None and None not in (s.candidate_correct, n.candidate_correct):
        lost = s.baseline_correct - s.candidate_correct
        floor_lost = s.baseline_correct - n.candidate_correct
        if lost > max(floor_lost, 0.0) + limits.max_score_drop + 1e-9:
            failures.append(f"task score {s.candidate_correct:.0%} vs baseline "
                            f"{s.baseline_correct:.0%}")
    return failures


def markdown(
    title: str,
    setup: Sequence[str],
    candidate: Sequence[BucketSummary],
    noise: Sequence[BucketSummary],
    results: Sequence[PromptResult],
    failures: dict[str, list[str]],
    paths: Sequence[PathRun] = (),
) -> str:
    """The whole report: setup, the per-bucket table (noise floor | candidate) with
    each bucket's verdict, each prompt's row, a section per path (tiers, graphs: what
    ran or why not, its counters and its table), and the failed checks."""
    lines = [f"# {title}", "", *(f"- {line}" for line in setup), "",
             *_bucket_table(candidate, noise, failures), "",
             "| prompt | bucket | tokens in / out | exact | first divergence | top-1 | KL "
             "| decision (base / cand.) |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(
            f"| {r.prompt.prompt_id} | {r.prompt.kind} | {len(r.prompt.token_ids)} / "
            f"{r.num_steps} | {'yes' if r.exact_match else 'no'} | {_opt(r.first_divergence)} | "
            f"{r.top1_agreement:.3f} | {r.mean_kl:.2e} | {_decision(r.baseline_decision, r.baseline_correct)}"
            f" / {_decision(r.candidate_decision, r.candidate_correct)} |"
        )
    failed = [f"{bucket}: {line}" for bucket, lines_ in failures.items() for line in lines_]
    for run in paths:
        lines += ["", f"## Path `{run.name}`: {'exercised' if run.exercised else 'not exercised'}",
                  "", f"- {run.reason}"]
        lines += [f"- {name} {value}" for name, value in run.counters.items()]
        if run.ran:
            lines += ["", *_bucket_table(run.candidate, noise, run.failures)]
        failed += [f"{run.name}/{bucket}: {line}" for bucket, lines_ in run.failures.items()
                   for line in lines_]
    lines += ["", "**FAIL**" if failed else "**PASS**", *(f"- {f}" for f in failed)]
    return "\n".join(lines) + "\n"


def _bucket_table(
    candidate: Sequence[BucketSummary], noise: Sequence[BucketSummary],
    failures: dict[str, list[str]],
) -> list[str]:
    """The per-bucket table: noise floor | candidate, and each bucket's verdict."""
    floor = {s.bucket: s for s in noise}
    lines = ["| bucket | prompts | exact match (noise / cand.) | median first divergence "
             "| top-1 (noise / cand.) | mean KL (noise / cand.) | same decision (noise / "
             "cand.) | task score (base / cand.) | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in candidate:
        n = floor[s.bucket]
        judged = "" if s.bucket == "all" else ("FAIL" if failures[s.bucket] else "pass")
        lines.append(
            f"| {s.bucket} | {s.num_prompts} | {n.exact_match_rate:.0%} / {s.exact_match_rate:.0%}"
            f" | {_opt(s.median_first_divergence)} | {n.top1_agreement:.3f} / "
            f"{s.top1_agreement:.3f} | {n.mean_kl:.2e} / {s.mean_kl:.2e} | "
            f"{_pct(n.same_decision)} / {_pct(s.same_decision)} | "
            f"{_pct(s.baseline_correct)} / {_pct(s.candidate_correct)} | {judged} |"
        )
    return lines


def _opt(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _decision(made: str | None, right: bool | None) -> str:
    if made is None:
        return "-"
    shown = " ".join(made.split()).replace("|", "\\|").replace("`", "'")[:60]
    return f"`{shown}` ({'right' if right else 'wrong'})"
