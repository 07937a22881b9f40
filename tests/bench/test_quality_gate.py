"""The KV quality gate on every shipped KV config (``configs/quality/*.toml``): each
category and the context-length needles pass on the demo model for the configs that
may take traffic, and the gate stops the SmolLM2 FP8 config, which fails on SmolLM2.

The demo runs are sized for CI (two prompts per category, a few new tokens, needles
at three depths of a prompt that fills the demo model's context); the pool is
smaller than the shipped configs' (the KV format, not the pool size, is under test).
The runs down the tier and graph paths are tested in test_quality_paths.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from bench.quality.gate import GateOptions, GateResult, run_gate
from bench.quality.prompts import CATEGORIES
from bench.quality.report import Thresholds, verdict
from workers.config import WorkerConfig, load_config

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "configs" / "quality"
BASELINE = "kv-auto.toml"
# How the gate must judge each shipped config: "pass" on the demo model, "exact"
# (pass, every answer identical), or "fail" on SmolLM2 (the config the gate stops).
EXPECTED = {
    "kv-auto.toml": "pass",
    "kv-fp8-e4m3-demo.toml": "pass",
    "prefix-cache-off.toml": "exact",
    "kv-fp8-e4m3-smollm2.toml": "fail",
    "kv-bf16.toml": "pass",  # the baseline FP8 is judged against: within the gate itself
}
DEMO = GateOptions(
    long_kinds=("max",),
    depths=(0.05, 0.5, 0.95),
    prompts_per_kind=2,
    max_new_tokens=8,
    max_new_tokens_long=4,
    paths=(),
)


def shipped(name: str, model: str, cache_bytes: int) -> WorkerConfig:
    """A shipped config on ``model`` with its scales file found from the repository,
    on one thread (two spinning threads on a shared CI machine cost more than one)."""
    config = load_config(SHIPPED / name)
    overrides: dict[str, dict[str, object]] = {
        "model": {"name": model, "num_threads": 1},
        "kv": {"cache_bytes": cache_bytes},
    }
    if config.kv.scales_file is not None:
        overrides["kv"]["scales_file"] = str(REPO / config.kv.scales_file)
    return config.with_overrides(overrides)


@pytest.fixture(scope="module", autouse=True)
def _threads() -> Iterator[None]:
    """Gives the other tests of the session their torch thread count back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def demo_gate() -> dict[str, GateResult]:
    """The gate over every config expected to pass, against the baseline, on demo."""
    names = [name for name, expect in EXPECTED.items() if expect != "fail"]
    candidates = [shipped(name, "demo", 32 << 20) for name in names]
    results = run_gate(shipped(BASELINE, "demo", 32 << 20), candidates, DEMO)
    return dict(zip(names, results, strict=True))


def test_every_shipped_kv_config_has_an_expected_verdict():
    assert {path.name for path in SHIPPED.glob("*.toml")} == set(EXPECTED)


@pytest.mark.parametrize("name", [n for n, e in EXPECTED.items() if e != "fail"])
def test_each_category_and_the_needles_pass_on_the_demo_model(demo_gate, name):
    result = demo_gate[name]
    assert set(result.failures) == {*CATEGORIES, "long-max"}
    assert result.passed, result.failures
    needles = [r for r in result.results if r.prompt.kind == "long-max"]
    assert len(needles) == 3 and all(len(r.prompt.token_ids) > 3900 for r in needles)


def test_the_prefix_cache_off_changes_no_answer(demo_gate):
    result = demo_gate["prefix-cache-off.toml"]
    exact = verdict(result.candidate, result.noise, Thresholds(require_exact=True))
    assert not any(exact.values()), exact


def test_the_smollm2_fp8_config_refuses_the_demo_model_and_fails_on_smollm2():
    name = next(n for n, e in EXPECTED.items() if e == "fail")
    with pytest.raises(ValueError, match="was calibrated for weights"):
        run_gate(shipped(BASELINE, "demo", 1 << 20), [shipped(name, "demo", 1 << 20)], DEMO)
    model = load_config(SHIPPED / name).model.name
    # Which bucket fails depends on the CPU's float kernels: on one machine multi-turn
    # loses "Alice", on another a refusal flips (docs/operations.md, "In CI").
    options = GateOptions(
        categories=("multi_turn", "refusal"), long_kinds=(), prompts_per_kind=2,
        max_new_tokens=16, paths=(),
    )
    (result,) = run_gate(shipped(BASELINE, model, 64 << 20), [shipped(name, model, 64 << 20)],
                         options)
    assert not result.passed
    assert any(result.failures.values()), result.failures
