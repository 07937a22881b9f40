"""``python -m bench.quality --baseline CONFIG --candidate CONFIG``: does a changed KV
path change the answers?

Both CONFIGs are worker TOML files (``workers.config``); ``--model`` overrides the
model of both (they must serve the same one). Three runs over the prompt set
(``bench/quality/prompts.py``): the baseline; the baseline again in a fresh
session with the prompts in reverse order (different prefix-cache hits and chunk
boundaries), which is the noise floor; and the candidate. Progress goes to stderr,
one line per prompt and run. Writes a markdown report
(``--report``, printed too) and exits 1 when a threshold fails (``report.Thresholds``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from bench.quality.compare import PromptResult, compare, summarize
from bench.quality.prompts import LONG_TARGETS, QualityPrompt, load_prompt_set
from bench.quality.report import Thresholds, markdown, verdict
from bench.quality.session import Generation, Session
from radix.model_source import DEMO_MODEL, resolve_model_path
from workers.config import WorkerConfig, load_config
from workers.model.demo import ensure_demo_checkpoint
from workers.model.loader import LoadedModel, load_model


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--baseline", required=True, help="worker TOML config of the reference KV path")
    add("--candidate", required=True, help="worker TOML config of the changed KV path")
    add("--model", help="model for both configs (demo, SmolLM2-135M-Instruct, a path)")
    add("--long", default="1k,4k,8k", help=f"long-context buckets, of {','.join(LONG_TARGETS)}")
    add("--prompts-per-kind", type=int, help="only the first N prompts of each kind")
    add("--max-new-tokens", type=int, default=32)
    add("--max-new-tokens-long", type=int, default=16)
    add("--report", type=Path, help="also write the markdown report here")
    add("--require-exact", action="store_true", help="every greedy answer must be identical")
    defaults = Thresholds()
    add("--max-exact-match-drop", type=float, default=defaults.max_exact_match_drop)
    add("--min-top1", type=float, default=defaults.min_top1)
    add("--max-kl", type=float, default=defaults.max_kl)
    add("--max-must-contain-drop", type=float, default=defaults.max_must_contain_drop)
    args = parser.parse_args(argv)
    args.long = [k for k in args.long.split(",") if k]
    if set(args.long) - set(LONG_TARGETS):
        parser.error(f"--long takes {', '.join(LONG_TARGETS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; returns the exit status (0 pass, 1 a threshold failed)."""
    args = parse_args(argv)
    configs = [_config(path, args.model) for path in (args.baseline, args.candidate)]
    if configs[0].model != configs[1].model:
        raise SystemExit("baseline and candidate must serve the same model (see --model)")
    loaded = _load(configs[0])
    started = time.monotonic()
    max_len = loaded.config.max_position_embeddings - max(args.max_new_tokens,
                                                          args.max_new_tokens_long)  # fmt: skip
    prompts = load_prompt_set(loaded.tokenizer, args.long, max_len, args.prompts_per_kind)
    budget = {p.prompt_id: _max_new(args, p) for p in prompts}
    base = Session(configs[0], loaded)
    paths = {}
    for p in prompts:
        _progress("baseline", p)
        paths[p.prompt_id] = base.generate(p.token_ids, budget[p.prompt_id])
    noise = _against(Session(configs[0], loaded), list(reversed(prompts)), paths, loaded)
    candidate_session = Session(configs[1], loaded)
    candidate = _against(candidate_session, prompts, paths, loaded)
    limits = Thresholds(args.max_exact_match_drop, args.min_top1, args.max_kl,
                        args.max_must_contain_drop, args.require_exact)  # fmt: skip
    noise_summary, candidate_summary = summarize(noise), summarize(candidate)
    failures = verdict(candidate_summary, noise_summary, limits)
    setup = [
        f"model `{configs[0].model.name}` (weights {loaded.weights_digest[:16]})",
        f"baseline `{args.baseline}`: {base.description}",
        f"candidate `{args.candidate}`: {candidate_session.description}",
        f"{len(prompts)} prompts, up to {args.max_new_tokens} new tokens "
        f"({args.max_new_tokens_long} for long prompts), greedy; noise floor: the baseline "
        f"again, prompts reversed; {time.monotonic() - started:.0f} s on {torch.get_num_threads()}"
        f" threads",
    ]
    text = markdown("KV quality: candidate vs baseline", setup, candidate_summary,
                    noise_summary, candidate, failures)  # fmt: skip
    print(text)
    if args.report is not None:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text, encoding="utf-8")
    return 1 if failures else 0


def _against(
    session: Session,
    prompts: list[QualityPrompt],
    paths: dict[str, Generation],
    loaded: LoadedModel,
) -> list[PromptResult]:
    """Each prompt's greedy run and its run forced along the baseline's path, compared;
    returned in the prompt set's order whatever order they ran in."""
    by_id = {}
    for prompt in prompts:
        _progress(session.description, prompt)
        baseline = paths[prompt.prompt_id]
        own = session.generate(prompt.token_ids, len(baseline.token_ids))
        forced = session.generate(prompt.token_ids, 0, forced=baseline.token_ids)
        decode = loaded.tokenizer.decode
        by_id[prompt.prompt_id] = compare(prompt, baseline, forced, own,
                                          decode(baseline.token_ids), decode(own.token_ids))  # fmt: skip
    order = sorted(paths, key=list(paths).index)
    return [by_id[prompt_id] for prompt_id in order if prompt_id in by_id]


def _progress(run: str, prompt: QualityPrompt) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {run}: {prompt.prompt_id} ({len(prompt.token_ids)} "
          "tokens)", file=sys.stderr, flush=True)  # fmt: skip


def _max_new(args: argparse.Namespace, prompt: QualityPrompt) -> int:
    return args.max_new_tokens_long if prompt.kind.startswith("long") else args.max_new_tokens


def _config(path: str, model: str | None) -> WorkerConfig:
    config = load_config(path)
    return config.with_overrides({"model": {"name": model}}) if model else config


def _load(config: WorkerConfig) -> LoadedModel:
    name = config.model.name
    path = ensure_demo_checkpoint() if name == DEMO_MODEL else resolve_model_path(name)
    device = "cuda" if config.model.device == "cuda" else "cpu"
    if config.model.num_threads is not None:
        torch.set_num_threads(config.model.num_threads)
    return load_model(path, torch.device(device))


if __name__ == "__main__":
    sys.exit(main())
