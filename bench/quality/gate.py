"""One run of the quality gate: the baseline, its noise floor and each candidate over
the prompt set, judged per bucket, and each candidate again down the tier and graph
paths.

One loaded model serves every run: the baseline; the baseline again in a fresh
session with the prompts in reverse order (other prefix-cache hits and chunk
boundaries), compared with the first run exactly as a candidate is, which is each
bucket's noise floor; each candidate; and each candidate down the paths of
``options.paths`` (``bench.quality.paths``: through the host and disk tiers, with
decode graphs), judged against the same floor, or recorded with the reason it could
not run. The prompts are the shipped set's selected categories and long lengths and
the user's file (``bench.quality.user_prompts``). Progress goes to stderr, one line
per prompt and run.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench.quality.compare import BucketSummary, PromptResult, compare, summarize
from bench.quality.paths import PATHS, PathRun, plan_path
from bench.quality.prompts import CATEGORIES, DEPTHS, QualityPrompt, load_prompt_set
from bench.quality.record import RunRecord, Secret
from bench.quality.report import Thresholds, verdict
from bench.quality.session import Generation, Session
from bench.quality.user_prompts import UserPromptFile
from radix.model_source import DEMO_MODEL, resolve_model_path
from workers.config import WorkerConfig
from workers.model.demo import ensure_demo_checkpoint
from workers.model.loader import LoadedModel, load_model


@dataclass(frozen=True)
class GateOptions:
    """What to run: which categories and long lengths, needle depths, the first
    ``prompts_per_kind`` prompts of each category (None: all), answer budgets, the
    user's prompts (None: none), and the paths (of ``paths.PATHS``) each candidate
    also runs down."""

    categories: Sequence[str] = CATEGORIES
    long_kinds: Sequence[str] = ("1k", "4k", "max")
    depths: Sequence[float] = DEPTHS
    prompts_per_kind: int | None = None
    max_new_tokens: int = 32
    max_new_tokens_long: int = 16
    thresholds: Thresholds = field(default_factory=Thresholds)
    user_prompts: UserPromptFile | None = None
    paths: Sequence[str] = PATHS


@dataclass(frozen=True)
class GateResult:
    """A finished run: per-bucket summaries of the candidate and of the noise floor,
    each prompt's candidate result, each bucket's failed checks (empty: pass), the
    setup lines, each path's run and where it all ran."""

    candidate: list[BucketSummary]
    noise: list[BucketSummary]
    results: list[PromptResult]
    failures: dict[str, list[str]]
    setup: list[str]
    paths: list[PathRun]
    record: RunRecord

    @property
    def passed(self) -> bool:
        """Whether every bucket passed, on the candidate's own path and on every other."""
        return not any(self.failures.values()) and all(p.passed for p in self.paths)


@dataclass(frozen=True)
class _Reference:
    """What every candidate is judged against: the loaded model, the prompts, the
    baseline's answer to each, its session and the noise floor."""

    loaded: LoadedModel
    prompts: list[QualityPrompt]
    answers: dict[str, Generation]
    baseline: Session
    noise: list[BucketSummary]
    secret: Secret


def run_gate(
    baseline: WorkerConfig, candidates: Sequence[WorkerConfig], options: GateOptions
) -> list[GateResult]:
    """Score each of ``candidates`` against ``baseline`` (all serving the same model);
    the baseline and its noise floor run once for all of them. A candidate whose KV
    path cannot be built (a scale file for other weights) raises before anything runs,
    and so does a user prompt too long for the model (``PromptFileError``)."""
    if any(c.model != baseline.model for c in candidates):
        raise ValueError("baseline and candidates must serve the same model")
    loaded = load(baseline)
    started = time.monotonic()
    secret = Secret.load()
    prompts = _prompts(loaded, options)
    sessions = [Session(candidate, loaded, secret.value) for candidate in candidates]
    base = Session(baseline, loaded, secret.value)
    answers = {}
    for p in prompts:
        _progress("baseline", p)
        answers[p.prompt_id] = base.generate(p.token_ids, _max_new(options, p))
    noise = summarize(_against(Session(baseline, loaded, secret.value),
                               list(reversed(prompts)), answers, loaded))
    reference = _Reference(loaded, prompts, answers, base, noise, secret)
    return [_judge(reference, config, session, options, started)
            for config, session in zip(candidates, sessions, strict=True)]


def _judge(
    ref: _Reference, config: WorkerConfig, session: Session, options: GateOptions,
    started: float,
) -> GateResult:
    """One candidate's run on its own path and down each path of ``options``
    (``started``: when the gate started, for the setup's time line)."""
    rows = _against(session, ref.prompts, ref.answers, ref.loaded)
    summary = summarize(rows)
    paths = [_run_path(ref, name, config, options) for name in options.paths]
    device = ref.loaded.model.lm_head.weight.device
    record = RunRecord.of(ref.baseline, session, device, ref.secret, options.user_prompts)
    setup = [
        f"model `{config.model.name}` (weights {ref.loaded.weights_digest[:16]})",
        f"baseline: {ref.baseline.description}",
        f"candidate: {session.description}",
        f"{len(ref.prompts)} prompts, up to {options.max_new_tokens} new tokens "
        f"({options.max_new_tokens_long} for long prompts), greedy; needles at depths "
        f"{', '.join(f'{d:g}' for d in options.depths)}; noise floor: the baseline "
        f"again, prompts reversed",
        *record.lines(),
        *(f"path {p.name}: {'yes' if p.exercised else 'no'} ({p.reason})" for p in paths),
        f"{time.monotonic() - started:.0f} s so far on {torch.get_num_threads()} threads",
    ]
    return GateResult(summary, ref.noise, rows, verdict(summary, ref.noise, options.thresholds),
                      setup, paths, record)


def _run_path(ref: _Reference, name: str, config: WorkerConfig, options: GateOptions) -> PathRun:
    """The candidate down path ``name``, judged against the noise floor, or the reason
    it cannot go there; a disk tier lives in a scratch directory removed afterwards."""
    longest = max(len(p.token_ids) + _max_new(options, p) for p in ref.prompts)
    with tempfile.TemporaryDirectory(prefix="quality-tiers-") as scratch:
        setup = plan_path(name, config, ref.loaded, longest, Path(scratch))
        if setup.config is None:
            return PathRun(name, setup.reason, ran=False)
        session = setup.session(ref.loaded, ref.secret.value)
        try:
            rows = _against(session, ref.prompts, ref.answers, ref.loaded)
        finally:
            session.close()
    summary = summarize(rows)
    return PathRun(name, f"{setup.reason}: {session.description}", True, summary, rows,
                   verdict(summary, ref.noise, options.thresholds), session.tier_counters())


def _prompts(loaded: LoadedModel, options: GateOptions) -> list[QualityPrompt]:
    """The selected categories and long lengths, each prompt leaving room for its answer,
    then the user's prompts (PromptFileError for one that leaves none)."""
    max_len = loaded.config.max_position_embeddings - max(options.max_new_tokens,
                                                          options.max_new_tokens_long)
    shipped = [
        p
        for p in load_prompt_set(
            loaded.tokenizer, options.long_kinds, max_len, options.prompts_per_kind, options.depths
        )
        if p.kind in options.categories or p.kind.startswith("long-")
    ]
    user = options.user_prompts
    prompts = shipped + ([] if user is None else user.quality_prompts(loaded.tokenizer, max_len))
    if not prompts:
        raise ValueError("no prompt selected: name categories, long lengths or a prompt file")
    return prompts


def load(config: WorkerConfig) -> LoadedModel:
    """The model ``config`` serves, loaded on its device (``auto``: CUDA when there is
    one, as a worker does)."""
    name = config.model.name
    path = ensure_demo_checkpoint() if name == DEMO_MODEL else resolve_model_path(name)
    device = config.model.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if config.model.num_threads is not None:
        torch.set_num_threads(config.model.num_threads)
    return load_model(path, torch.device(device))


def _against(
    session: Session,
    prompts: list[QualityPrompt],
    answers: dict[str, Generation],
    loaded: LoadedModel,
) -> list[PromptResult]:
    """Each prompt's greedy run and its run forced along the baseline's path, compared;
    returned in the prompt set's order whatever order they ran in."""
    by_id = {}
    for prompt in prompts:
        _progress(session.description, prompt)
        baseline = answers[prompt.prompt_id]
        own = session.generate(prompt.token_ids, len(baseline.token_ids))
        forced = session.generate(prompt.token_ids, 0, forced=baseline.token_ids)
        decode = loaded.tokenizer.decode
        by_id[prompt.prompt_id] = compare(prompt, baseline, forced, own,
                                          decode(baseline.token_ids), decode(own.token_ids))
    return [by_id[prompt_id] for prompt_id in answers if prompt_id in by_id]


def _progress(run: str, prompt: QualityPrompt) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {run}: {prompt.prompt_id} ({len(prompt.token_ids)} "
          "tokens)", file=sys.stderr, flush=True)


def _max_new(options: GateOptions, prompt: QualityPrompt) -> int:
    return options.max_new_tokens_long if prompt.kind.startswith("long-") else options.max_new_tokens
