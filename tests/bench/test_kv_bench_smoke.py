"""The KV benchmark runs end to end on a small workload, evicting and copying."""

from bench import kv_bench


def test_kv_bench_small_run(capsys):
    results = kv_bench.main(["--requests", "40", "--num-blocks", "300"])
    work = results["workload"]
    assert work["admit"]["n"] == 40 and work["fork"]["n"] == 40 and work["finish"]["n"] == 80
    assert work["num_evicted_blocks"] > 0 and work["num_cow_copies"] >= 40
    assert results["metadata"]["pool_bytes_per_block"] > 0
    assert "admit (4K-token hit)" in capsys.readouterr().out
