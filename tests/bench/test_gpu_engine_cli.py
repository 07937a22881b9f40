"""bench.gpu_engine's CPU side: options, the no-GPU message, and a smoke run of the
whole script on a tiny model (graphs replayed eagerly; the timings mean nothing)."""

from __future__ import annotations

import json

import pytest
import torch

from bench import gpu_engine

TINY = ["--device", "cpu", "--dtype", "float32", "--layers", "2", "--hidden", "64",
        "--heads", "4", "--kv-heads", "2", "--intermediate", "128", "--vocab", "320",
        "--prompt", "16", "--batches", "1,3", "--steps", "2"]


def test_defaults_are_the_one_b_shape():
    args = gpu_engine.parse_args([])
    assert (args.layers, args.hidden, args.heads, args.kv_heads, args.intermediate,
            args.vocab, args.batches, args.dtype) == (
        16, 2048, 32, 8, 8192, 32000, [1, 32, 128], "bfloat16")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_without_cuda_it_exits_with_a_message():
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        gpu_engine.main([])


def test_smoke_run_on_a_tiny_model(tmp_path, capsys):
    out = tmp_path / "results.json"
    results = gpu_engine.main([*TINY, "--json", str(out)])
    assert json.loads(out.read_text()) == results
    assert results["greedy_graphs_equal_eager"] is True
    assert [row["batch"] for row in results["runner"]] == [1, 3]
    for row in results["runner"]:
        assert row["floor_ms"] > 0 and row["eager"]["ms"] > 0 and row["graphs"]["ms"] > 0
        assert row["graphs"]["replayed"] and not row["eager"]["replayed"]
    assert [(row["batch"], row["replayed_steps"]) for row in results["engine"]] == [(1, 2), (3, 2)]
    assert [row["batch"] for row in results["transformers"]] == [1, 3]
    assert "| 3 |" in capsys.readouterr().out
