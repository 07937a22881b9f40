"""``python -m bench lora_decode`` runs end to end on a few steps and reports both
timings and their ratio (the figures themselves are docs/adapters.md's)."""

from __future__ import annotations

from bench import lora_decode_bench


def test_lora_decode_bench_reports_base_and_lora_step_times():
    results = lora_decode_bench.main(["--steps", "2", "--rank", "4"])
    assert results["adapters"] == 4 and results["batch"] == 16
    assert results["base_ms_per_step"] > 0 and results["lora_ms_per_step"] > 0
    ratio = results["lora_ms_per_step"] / results["base_ms_per_step"]
    assert abs(results["ratio"] - ratio) < 0.01
