"""bench.quality on the demo model: prefix cache on vs off is exact, an FP8 candidate
is scored against the noise floor, and a failed threshold is exit status 1 with the
failed bucket named in the JSON verdict."""

from __future__ import annotations

import json
from pathlib import Path

from bench.quality.__main__ import main
from harness.procs import REPO_ROOT

SMALL = [
    "--model",
    "demo",
    "--long",
    "",
    "--max-new-tokens",
    "4",
    "--prompts-per-kind",
    "2",
    "--categories",
    "short,multi_turn",
]


def config(tmp_path: Path, name: str, kv: str) -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'[model]\nname = "demo"\n\n[kv]\ncache_bytes = 16777216\n{kv}\n')
    return str(path)


def test_prefix_cache_off_gives_exactly_the_same_answers(tmp_path):
    report = tmp_path / "report.md"
    status = main(["--baseline", config(tmp_path, "on", ""),
                   "--candidate", config(tmp_path, "off", "prefix_cache = false"),
                   "--require-exact", "--report", str(report), *SMALL])
    text = report.read_text()
    assert status == 0, text
    assert "| short | 2 | 100% / 100% |" in text and "**PASS**" in text


def test_an_fp8_candidate_is_scored_and_a_strict_threshold_fails(tmp_path):
    scales = REPO_ROOT / "configs" / "kv-scales" / "demo.json"
    fp8 = config(tmp_path, "fp8", f'cache_dtype = "fp8_e4m3"\nscales_file = "{scales}"')
    report, verdicts = tmp_path / "report.md", tmp_path / "report.json"
    status = main(["--baseline", config(tmp_path, "on", ""), "--candidate", fp8, *SMALL,
                   "--max-kl", "1e-12", "--report", str(report), "--json", str(verdicts)])
    text = report.read_text()
    assert "float8_e4m3fn KV" in text and "**FAIL**" in text and "mean KL" in text
    assert status == 1
    judged = json.loads(verdicts.read_text())[fp8]
    assert judged["passed"] is False and set(judged["buckets"]) == {"short", "multi_turn"}
    short = judged["buckets"]["short"]
    assert short["failures"][0].startswith("mean KL") and short["noise_floor"]["mean_kl"] < 1e-3
