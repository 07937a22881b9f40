"""The quality gate on the user's prompts, down the tier and graph paths, on the demo
model: the user's buckets are judged beside the shipped ones, the tier run gets
blocks back from the host and the disk tier (the worker's own counters say so) and
changes no answer, a path that cannot run says why, and the verdict records the
namespace digest a worker with the same config reports, the engine version and the
prompt files' digests."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from bench.quality.__main__ import main
from bench.quality.prompts import PROMPTS_FILE
from radix.namespace import SECRET_ENV
from radix.version import project_version
from workers.build import build_worker
from workers.config import load_config

SECRET = "quality-paths-secret"
USER_PROMPTS = [
    {"prompt": "The capital of France is a city called", "expected": "Paris"},
    {"messages": [{"role": "user", "content": "Tell me a long story about a cat who lives in "
                   "a warehouse full of copper wire, oak planks and glass jars."}],
     "bucket": "stories", "id": "cat"},
    {"messages": [{"role": "system", "content": "You are terse."},
                  {"role": "user", "content": "Tell me a long story about a dog who lives in a "
                   "warehouse full of copper wire, oak planks and glass jars."}],
     "bucket": "stories"},
]


def config(tmp_path: Path, name: str, kv: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'[model]\nname = "demo"\n\n[kv]\ncache_bytes = 16777216\n{kv}\n')
    return path


@pytest.fixture(scope="module")
def gated(tmp_path_factory) -> dict[str, object]:
    """One gate run: the same config and the prefix cache off as candidates, one
    shipped short prompt and the user's file, with a deployment secret set."""
    tmp = tmp_path_factory.mktemp("quality-paths")
    prompts = tmp / "mine.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in USER_PROMPTS))
    base, off = config(tmp, "base", ""), config(tmp, "off", "prefix_cache = false")
    verdict, report = tmp / "verdict.json", tmp / "report.md"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(SECRET_ENV, SECRET)
        status = main(["--baseline", str(base), "--candidate", str(base), "--candidate", str(off),
                       "--categories", "short", "--prompts-per-kind", "1", "--long", "",
                       "--max-new-tokens", "4", "--prompts", str(prompts),
                       "--json", str(verdict), "--report", str(report)])
    return {"status": status, "verdicts": json.loads(verdict.read_text()),
            "report": report.read_text(), "base": base, "off": off, "prompts": prompts}


def test_the_user_buckets_are_judged_beside_the_shipped_ones(gated):
    assert gated["status"] == 0, gated["report"]
    buckets = gated["verdicts"][str(gated["base"])]["buckets"]
    assert set(buckets) == {"short", "user", "stories"}
    assert buckets["user"]["candidate"]["num_prompts"] == 1
    assert buckets["stories"]["candidate"]["num_prompts"] == 2
    # "expected" makes a task check; without it the baseline's answer is the reference
    assert buckets["user"]["candidate"]["baseline_correct"] is not None
    assert buckets["stories"]["candidate"]["same_decision"] is None
    assert "| mine.jsonl:cat | stories |" in gated["report"]


def test_the_tier_path_gets_blocks_back_from_host_and_disk_and_changes_no_answer(gated):
    tiers = gated["verdicts"][str(gated["base"])]["paths"]["tiers"]
    assert tiers["exercised"] and tiers["passed"]
    assert tiers["counters"]["kv_host_hit_blocks_total"] > 0
    assert tiers["counters"]["kv_disk_hit_blocks_total"] > 0
    assert set(tiers["buckets"]) == {"short", "user", "stories"}
    assert all(b["candidate"]["exact_match_rate"] == 1.0 for b in tiers["buckets"].values())
    assert "## Path `tiers`: exercised" in gated["report"]


def test_a_path_that_cannot_run_says_why(gated):
    off = gated["verdicts"][str(gated["off"])]["paths"]
    assert not off["tiers"]["exercised"] and not off["tiers"]["ran"]
    assert "without the prefix cache" in off["tiers"]["reason"]
    graphed = gated["verdicts"][str(gated["base"])]["paths"]["graphed"]
    if torch.cuda.is_available():
        assert graphed["exercised"] and graphed["passed"], graphed
    else:
        assert not graphed["exercised"] and "CUDA graphs are GPU-only" in graphed["reason"]
        assert "path graphed: no (skipped: CUDA graphs are GPU-only" in gated["report"]


def test_the_verdict_records_namespace_engine_version_and_prompt_digests(gated):
    worker = build_worker(load_config(gated["base"]), "w", SECRET.encode()).identity
    for candidate in ("base", "off"):
        record = gated["verdicts"][str(gated[candidate])]["record"]
        assert record["engine_version"] == project_version() == worker.engine_version
        assert record["candidate_namespace"]["digest"] == worker.namespace_digest
        assert record["candidate_namespace"]["fields"] == worker.namespace.to_dict()
        assert record["baseline_namespace"]["digest"] == worker.namespace_digest
        assert record["secret_source"] == f"${SECRET_ENV}"
        assert record["user_prompts"] == str(gated["prompts"])
        assert record["user_prompts_sha256"] == hashlib.sha256(
            gated["prompts"].read_bytes()).hexdigest()
        assert record["shipped_prompts_sha256"] == hashlib.sha256(
            PROMPTS_FILE.read_bytes()).hexdigest()
    assert worker.namespace_digest in gated["report"]
