"""``python -m bench.quality --baseline CONFIG --candidate CONFIG``: does a changed KV
path change the answers, category by category?

Both CONFIGs are worker TOML files (``workers.config``); ``--model`` overrides the
model of both (they must serve the same one). The run (``bench.quality.gate``)
scores every category of the prompt set (``bench.quality.prompts``) and each
long-context length against its own noise floor. Writes a markdown report
(``--report``, printed too) and the per-bucket verdicts as JSON (``--json``), one
of each per candidate, and exits 1 when a bucket of any candidate fails (``report.Thresholds``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from bench.quality.gate import GateOptions, GateResult, run_gate
from bench.quality.prompts import CATEGORIES, DEPTHS, LONG_TARGETS
from bench.quality.report import Thresholds, markdown
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
                          args.max_new_tokens, args.max_new_tokens_long, limits)
    results = run_gate(baseline, candidates, options)
    texts, verdicts = [], {}
    for path, result in zip(args.candidate, results, strict=True):
        setup = [f"baseline `{args.baseline}`, candidate `{path}`", *result.setup]
        texts.append(markdown(f"KV quality: `{path}` vs baseline", setup, result.candidate,
                              result.noise, result.results, result.failures))
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
    """The machine-readable verdict: setup lines, overall pass, and per bucket the
    candidate's and the noise floor's summaries with the failed checks."""
    floor = {s.bucket: s for s in result.noise}
    buckets = {
        s.bucket: {"passed": not result.failures[s.bucket], "failures": result.failures[s.bucket],
                   "candidate": asdict(s), "noise_floor": asdict(floor[s.bucket])}
        for s in result.candidate
        if s.bucket != "all"
    }
    return {"setup": setup, "passed": result.passed, "buckets": buckets}


def _config(path: str, model: str | None) -> WorkerConfig:
    config = load_config(path)
    return config.with_overrides({"model": {"name": model}}) if model else config


if __name__ == "__main__":
    sys.exit(main())
