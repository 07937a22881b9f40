"""``python -m bench headroom`` on a small trace: it fills the pool (preemptions happen
without a watermark) and reports each watermark's block count."""

from __future__ import annotations

from bench import headroom


def test_headroom_bench_reports_each_watermark():
    result = headroom.main(["--requests", "24", "--num-blocks", "100", "--watermarks", "0,0.05"])
    rows = result["rows"]
    assert [(row["watermark"], row["num_watermark_blocks"]) for row in rows] == [(0.0, 0), (0.05, 5)]
    assert rows[0]["preemptions_per_1000_requests"] > 0, "the trace fills the pool"
    assert all(row["recomputed_tokens"] >= 0 for row in rows)
