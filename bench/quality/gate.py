"""One run of the quality gate: the baseline, its noise floor and the candidate over
the prompt set, judged per category.

Three runs share one loaded model: the baseline; the baseline again in a fresh
session with the prompts in reverse order (other prefix-cache hits and chunk
boundaries), compared with the first run exactly as the candidate is, which is each
bucket's noise floor; and the candidate. Progress goes to stderr, one line per
prompt and run.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from bench.quality.compare import BucketSummary, PromptResult, compare, summarize
from bench.quality.prompts import CATEGORIES, DEPTHS, QualityPrompt, load_prompt_set
from bench.quality.report import Thresholds, verdict
from bench.quality.session import Generation, Session
from radix.model_source import DEMO_MODEL, resolve_model_path
from workers.config import WorkerConfig
from workers.model.demo import ensure_demo_checkpoint
from workers.model.loader import LoadedModel, load_model


@dataclass(frozen=True)
class GateOptions:
    """What to run: which categories and long lengths, needle depths, the first
    ``prompts_per_kind`` prompts of each category (None: all), answer budgets."""

    categories: Sequence[str] = CATEGORIES
    long_kinds: Sequence[str] = ("1k", "4k", "max")
    depths: Sequence[float] = DEPTHS
    prompts_per_kind: int | None = None
    max_new_tokens: int = 32
    max_new_tokens_long: int = 16
    thresholds: Thresholds = field(default_factory=Thresholds)


@dataclass(frozen=True)
class GateResult:
    """A finished run: per-bucket summaries of the candidate and of the noise floor,
    each prompt's candidate result, and each bucket's failed checks (empty: pass)."""

    candidate: list[BucketSummary]
    noise: list[BucketSummary]
    results: list[PromptResult]
    failures: dict[str, list[str]]
    setup: list[str]

    @property
    def passed(self) -> bool:
        """Whether every bucket passed."""
        return not any(self.failures.values())


def run_gate(
    baseline: WorkerConfig, candidates: Sequence[WorkerConfig], options: GateOptions
) -> list[GateResult]:
    """Score each of ``candidates`` against ``baseline`` (all serving the same model);
    the baseline and its noise floor run once for all of them. A candidate whose KV
    path cannot be built (a scale file for other weights) raises before anything runs."""
    if any(c.model != baseline.model for c in candidates):
        raise ValueError("baseline and candidates must serve the same model")
    loaded = load(baseline)
    started = time.monotonic()
    prompts = _prompts(loaded, options)
    sessions = [Session(candidate, loaded) for candidate in candidates]
    base = Session(baseline, loaded)
    paths = {}
    for p in prompts:
        _progress("baseline", p)
        paths[p.prompt_id] = base.generate(p.token_ids, _max_new(options, p))
    noise = summarize(_against(Session(baseline, loaded), list(reversed(prompts)), paths, loaded))
    head = [
        f"model `{baseline.model.name}` (weights {loaded.weights_digest[:16]})",
        f"baseline: {base.description}",
    ]
    results = []
    for session in sessions:
        rows = _against(session, prompts, paths, loaded)
        summary = summarize(rows)
        setup = [*head, f"candidate: {session.description}",
                 f"{len(prompts)} prompts, up to {options.max_new_tokens} new tokens "
                 f"({options.max_new_tokens_long} for long prompts), greedy; needles at depths "
                 f"{', '.join(f'{d:g}' for d in options.depths)}; noise floor: the baseline "
                 f"again, prompts reversed; {time.monotonic() - started:.0f} s so far on "
                 f"{torch.get_num_threads()} threads"]
        failures = verdict(summary, noise, options.thresholds)
        results.append(GateResult(summary, noise, rows, failures, setup))
    return results


def _prompts(loaded: LoadedModel, options: GateOptions) -> list[QualityPrompt]:
    """The selected categories and long lengths, each prompt leaving room for its answer."""
    max_len = loaded.config.max_position_embeddings - max(options.max_new_tokens,
                                                          options.max_new_tokens_long)
    return [
        p
        for p in load_prompt_set(
            loaded.tokenizer, options.long_kinds, max_len, options.prompts_per_kind, options.depths
        )
        if p.kind in options.categories or p.kind.startswith("long")
    ]


def load(config: WorkerConfig) -> LoadedModel:
    """The model ``config`` serves, loaded on its device."""
    name = config.model.name
    path = ensure_demo_checkpoint() if name == DEMO_MODEL else resolve_model_path(name)
    device = "cuda" if config.model.device == "cuda" else "cpu"
    if config.model.num_threads is not None:
        torch.set_num_threads(config.model.num_threads)
    return load_model(path, torch.device(device))


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
                                          decode(baseline.token_ids), decode(own.token_ids))
    return [by_id[prompt_id] for prompt_id in paths if prompt_id in by_id]


def _progress(run: str, prompt: QualityPrompt) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {run}: {prompt.prompt_id} ({len(prompt.token_ids)} "
          "tokens)", file=sys.stderr, flush=True)


def _max_new(options: GateOptions, prompt: QualityPrompt) -> int:
    return options.max_new_tokens_long if prompt.kind.startswith("long") else options.max_new_tokens
