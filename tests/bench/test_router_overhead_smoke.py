"""The router-overhead benchmark runs every scenario through our router end to end
(unique, repeated and chat prompts; whole and streamed) on a small count."""

import pytest

from bench import router_overhead

pytestmark = pytest.mark.slow


def test_router_overhead_small_run_measures_every_scenario():
    results = router_overhead.main(["--requests", "8", "--without-peers"])
    ours = results["ours"]
    assert set(ours) == {name for name, *_ in router_overhead.SCENARIOS}
    for row in ours.values():
        assert row["router_rps"] > 0 and row["direct_rps"] > 0
        assert row["cluster_cpu_us_per_request"] >= row["router_cpu_us_per_request"] >= 0
    assert ours["64c_chat"]["encode_us"] > 0
    stages = results["stages"]  # 8 requests are too few profiler ticks for shares, or even
    assert set(stages) == {"64c_text", "64c_repeat", "64c_chat"}  # one tick per scenario
    for row in stages.values():
        assert {"tokenize", "forward", "relay", "total"} <= set(row) and min(row.values()) >= 0
