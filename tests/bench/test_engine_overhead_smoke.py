"""The engine overhead benchmark runs end to end on a short workload."""

from bench import engine_overhead


def test_engine_overhead_small_run(capsys):
    results = engine_overhead.main(["--steps", "4", "--prefill-tokens", "300",
                                    "--chunk-tokens", "64"])
    for batch in engine_overhead.BATCHES:
        row = results["decode"][batch]
        assert 0 < row["model_us"] < row["step_us"]
    assert results["chunked_prefill"]["num_chunks"] == 4
    assert "overhead µs/token" in capsys.readouterr().out
