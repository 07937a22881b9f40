"""``python -m bench.quality --baseline CONFIG --candidate CONFIG``: does a changed KV
path change the answers, category by category?

Both CONFIGs are worker TOML files (``workers.config``); ``--model`` overrides the
model of both (they must serve the same one). The run (``bench.quality.gate``)
scores every category of the prompt set (``bench.quality.prompts``), each
long-context length and each bucket of the user's ``--prompts FILE``
(``bench.quality.user_prompts``) against its own noise floor, on the candidate's
own KV path and down each of ``--paths`` (``bench.quality.paths``: the host and disk
tiers, decode graphs). Writes a markdown report (``--report``, printed too) and the
verdicts as JSON (``--json``), one of each per candidate, with where it ran
(``bench.quality.record``), and exits 1 when a bucket of any candidate fails on any
path (``report.Thresholds``), 2 for bad arguments or a prompt file it cannot use.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from bench.quality.compare import BucketSummary
from bench.quality.gate import GateOptions, GateResult, run_gate
from bench.quality.paths import PATHS
from bench.quality.prompts import CATEGORIES, DEPTHS, LONG_TARGETS
from bench.quality.report import Thresholds, markdown
from bench.quality.user_prompts import PromptFileError, read_user_prompts
from workers.config import WorkerConfig, load_config


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--baseline", required=True, help="worker TOML config of the reference KV path")
    add("--candidate", required=True, action="append",
        help="worker TOML config of a changed KV path (repeat to gate several)")
    add("--model", help="model for both configs (demo, SmolLM2-135M-Instruct, a path)")
    add("--categories", default=",".join(CATEGORIES), help="prompt categories to run")
    add("--long", default="1k,4k,max", help=f"long-context lengths, of {','.join(LONG_TARGETS)}"
        " (max: the longest prompt that leaves room for the answer)")
    add("--depths", default=",".join(f"{d:g}" for d in DEPTHS), help="needle depths (0-1)")
    add("--prompts-per-kind", type=int, help="only the first N prompts of each category")
    add("--prompts", type=Path, metavar="FILE",
        help="also the user's prompts: JSONL, one {\"prompt\"|\"messages\", \"expected\"?, "
             "\"bucket\"?, \"id\"?} a line")
    add("--paths", default=",".join(PATHS),
        help=f"paths each candidate also runs down, of {','.join(PATHS)} (empty: none)")
    add("--max-new-tokens", type=int, default=32)
    add("--max-new-tokens-long", type=int, default=16)
    add("--report", type=Path, help="also write the markdown report here")
    add("--json", type=Path, help="also write the per-bucket summaries and verdicts here")
    add("--require-exact", action="store_true", help="every greedy answer must be identical")
    defaults = Thresholds()
    for name in ("max_exact_match_drop", "min_top1", "max_kl", "max_decision_drop",
                 "max_score_drop"):
        add(f"--{name.replace('_', '-')}", type=float, default=getattr(defaults, name))
    args = parser.parse_args(argv)
    args.categories = [c for c in args.categories.split(",") if c]
    args.long = [k for k in args.long.split(",") if k]
    if set(args.long) - set(LONG_TARGETS) or set(args.categories) - set(CATEGORIES):
        parser.error(
            f"--long takes {', '.join(LONG_TARGETS)}; --categories {', '.join(CATEGORIES)}"
        )
    args.depths = [float(d) for d in args.depths.split(",") if d]
    if not args.depths or any(not 0.0 <= d <= 1.0 for d in args.depths):
        parser.error("--depths takes shares of the document between 0 and 1")
    args.paths = [p for p in args.paths.split(",") if p]
    if set(args.paths) - set(PATHS):
        parser.error(f"--paths takes {', '.join(PATHS)}")
    try:
        args.prompts = None if args.prompts is None else read_user_prompts(args.prompts)
    except PromptFileError as exc:
        parser.error(f"--prompts: {exc}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the gate; returns the exit status (0 every candidate passes, 1 a bucket failed)."""
    args = parse_args(argv)
    baseline = _config(args.baseline, args.model)
    candidates = [_config(path, args.model) for path in args.candidate]
    if any(c.model != baseline.model for c in candidates):
        raise SystemExit("baseline and candidates must serve the same model (see --model)")
    limits = Thresholds(args.max_exact_match_drop, args.min_top1, args.max_kl,
                        args.max_decision_drop, args.max_score_drop, args.require_exact)
    options = GateOptions(args.categories, args.long, args.depths, args.prompts_per_kind,
                          args.max_new_tokens, args.max_new_tokens_long, limits, args.prompts,
                          args.paths)
    try:
        results = run_gate(baseline, candidates, options)
    except PromptFileError as exc:
        print(f"error: --prompts: {exc}", file=sys.stderr)
        return 2
    texts, verdicts = [], {}
    for path, result in zip(args.candidate, results, strict=True):
        setup = [f"baseline `{args.baseline}`, candidate `{path}`", *result.setup]
        texts.append(markdown(f"KV quality: `{path}` vs baseline", setup, result.candidate,
                              result.noise, result.results, result.failures, result.paths))
        verdicts[path] = summary_json(result, setup)
    text = "\n".join(texts)
    print(text)
    if args.report is not None:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text, encoding="utf-8")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(verdicts, indent=1) + "\n", encoding="utf-8")
    return 0 if all(r.passed for r in results) else 1


def summary_json(result: GateResult, setup: list[str]) -> dict[str, object]:
    """The machine-readable verdict: setup lines, overall pass, per bucket the
    candidate's and the noise floor's summaries with the failed checks, where it ran
    (``record``), and per path whether it was exercised, why or why not, its counters
    and its buckets."""
    paths = {
        run.name: {"exercised": run.exercised, "ran": run.ran, "reason": run.reason,
                   "passed": run.passed, "counters": run.counters,
                   "buckets": _buckets(run.candidate, result.noise, run.failures)}
        for run in result.paths
    }
    return {"setup": setup, "passed": result.passed, "record": asdict(result.record),
            "buckets": _buckets(result.candidate, result.noise, result.failures),
            "paths": paths}


def _buckets(candidate: list[BucketSummary], noise: list[BucketSummary],
             failures: dict[str, list[str]]) -> dict[str, object]:
    floor = {s.bucket: s for s in noise}
    return {
        s.bucket: {"passed": not failures[s.bucket], "failures": failures[s.bucket],
                   "candidate": asdict(s), "noise_floor": asdict(floor[s.bucket])}
        for s in candidate
        if s.bucket != "all"
    }


def _config(path: str, model: str | None) -> WorkerConfig:
    config = load_config(path)
    return config.with_overrides({"model": {"name": model}}) if model else config


if __name__ == "__main__":
    sys.exit(main())
