"""The quality harness's markdown report and its verdict against thresholds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.quality.compare import BucketSummary, PromptResult

SHORT_BUCKETS = ("short", "multi_turn")


@dataclass(frozen=True)
class Thresholds:
    """What the candidate must meet. Exact-match rates of the short buckets may fall
    at most ``max_exact_match_drop`` below the noise floor's; every bucket needs top-1
    agreement >= ``min_top1`` and mean KL <= ``max_kl``; the must-contain rate may fall
    at most ``max_must_contain_drop`` below the baseline's. ``require_exact``: greedy
    exact match in every bucket (a change that must not alter any answer)."""

    max_exact_match_drop: float = 0.5
    min_top1: float = 0.9
    max_kl: float = 0.05
    max_must_contain_drop: float = 0.0
    require_exact: bool = False


def verdict(
    candidate: Sequence[BucketSummary], noise: Sequence[BucketSummary], limits: Thresholds
) -> list[str]:
    """The failed checks, one line each (empty: the candidate passes)."""
    floor = {s.bucket: s for s in noise}
    failures = []
    for s in candidate:
        if s.bucket == "all":
            continue
        if limits.require_exact and s.exact_match_rate < 1.0:
            failures.append(f"{s.bucket}: greedy exact match {s.exact_match_rate:.0%}, need 100%")
        drop = floor[s.bucket].exact_match_rate - s.exact_match_rate
        if s.bucket in SHORT_BUCKETS and drop > limits.max_exact_match_drop:
            failures.append(f"{s.bucket}: exact match {drop:.0%} below the noise floor "
                            f"(allowed {limits.max_exact_match_drop:.0%})")  # fmt: skip
        if s.top1_agreement < limits.min_top1:
            failures.append(f"{s.bucket}: top-1 agreement {s.top1_agreement:.3f} < {limits.min_top1}")
        if s.mean_kl > limits.max_kl:
            failures.append(f"{s.bucket}: mean KL {s.mean_kl:.4f} > {limits.max_kl}")
        if s.baseline_must_contain is not None and s.candidate_must_contain is not None:
            lost = s.baseline_must_contain - s.candidate_must_contain
            if lost > limits.max_must_contain_drop:
                failures.append(f"{s.bucket}: must-contain {s.candidate_must_contain:.0%} vs "
                                f"baseline {s.baseline_must_contain:.0%}")  # fmt: skip
    return failures


def markdown(
    title: str,
    setup: Sequence[str],
    candidate: Sequence[BucketSummary],
    noise: Sequence[BucketSummary],
    results: Sequence[PromptResult],
    failures: Sequence[str],
) -> str:
    """The whole report: setup, the per-bucket table (noise floor | candidate), each
    prompt's row, and the verdict."""
    floor = {s.bucket: s for s in noise}
    lines = [f"# {title}", "", *(f"- {line}" for line in setup), "",
             "| bucket | prompts | exact match (noise / cand.) | median first divergence "
             "| top-1 (noise / cand.) | mean KL (noise / cand.) | must-contain (base / cand.) |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for s in candidate:
        n = floor[s.bucket]
        lines.append(
            f"| {s.bucket} | {s.num_prompts} | {n.exact_match_rate:.0%} / {s.exact_match_rate:.0%}"
            f" | {_opt(s.median_first_divergence)} | {n.top1_agreement:.3f} / "
            f"{s.top1_agreement:.3f} | {n.mean_kl:.2e} / {s.mean_kl:.2e} | "
            f"{_pct(s.baseline_must_contain)} / {_pct(s.candidate_must_contain)} |"
        )
    lines += ["", "| prompt | bucket | tokens in / out | exact | first divergence | top-1 | KL "
              "| must-contain (base / cand.) |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        lines.append(
            f"| {r.prompt.prompt_id} | {r.prompt.kind} | {len(r.prompt.token_ids)} / "
            f"{r.num_steps} | {'yes' if r.exact_match else 'no'} | {_opt(r.first_divergence)} | "
            f"{r.top1_agreement:.3f} | {r.mean_kl:.2e} | {_flag(r.baseline_contains)} / "
            f"{_flag(r.candidate_contains)} |"
        )
    lines += ["", "**PASS**" if not failures else "**FAIL**", *(f"- {f}" for f in failures)]
    return "\n".join(lines) + "\n"


def _opt(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _flag(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")
