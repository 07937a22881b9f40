"""The radix benchmark runs end to end on a small workload and evicts under its cap."""

from bench import radix_bench


def test_radix_bench_small_run_respects_the_cap():
    results = radix_bench.main(["--requests", "300", "--cap-tokens", "200000"])
    assert results["gc_on"]["cached_tokens"] <= 200_000
    assert results["gc_on"]["num_evict_calls"] > 0
    assert results["gc_on"]["match"]["n"] == 270
