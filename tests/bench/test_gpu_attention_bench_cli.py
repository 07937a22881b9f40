"""bench.gpu_attention's CPU side: options parse, and it refuses to run without CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from bench import gpu_attention
from harness.procs import REPO_ROOT


def test_options_parse():
    args = gpu_attention.parse_args(
        ["--dtype", "float16", "--decode-batches", "2,8", "--iters", "3"]
    )
    assert (args.dtype, args.decode_batches, args.iters, args.block_size, args.kv_dtype) == (
        "float16",
        [2, 8],
        3,
        16,
        "auto",
    )
    assert gpu_attention.parse_args(["--kv-dtype", "fp8_e5m2"]).kv_dtype == "fp8_e5m2"


@pytest.mark.parametrize(
    "argv", [["--heads", "30", "--kv-heads", "8"], ["--block-size", "0"], ["--lora-rank", "0"]]
)
def test_bad_shapes_are_rejected(argv):
    with pytest.raises(SystemExit):
        gpu_attention.parse_args(argv)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_without_cuda_it_exits_with_a_message():
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        gpu_attention.main([])


@pytest.mark.slow
def test_smoke_run_on_cpu_through_the_triton_interpreter(tmp_path):
    pytest.importorskip("triton")
    out = tmp_path / "results.json"
    argv = ["--device", "cpu", "--dtype", "float32", "--heads", "4", "--kv-heads", "2",
            "--head-dim", "16", "--context", "64", "--decode-batches", "2", "--prefill-batch", "1",
            "--prefill-new", "16", "--prefill-cached", "16", "--store-tokens", "8", "--iters", "1",
            "--lora-hidden", "24", "--lora-rank", "4", "--lora-adapters", "2",
            "--lora-decode-rows", "4", "--lora-prefill-tokens", "20", "--json", str(out)]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    subprocess.run([sys.executable, "-m", "bench.gpu_attention", *argv], env=env, check=True,
                   cwd=REPO_ROOT, capture_output=True, timeout=120)
    results = json.loads(out.read_text())
    assert max(results["correctness"].values()) < 1e-5
    assert [row["batch"] for row in results["decode"]] == [2]
    assert max(results["lora_correctness"].values()) < 1e-5
    assert [(row["rows"], row["runs"]) for row in results["lora"]] == [(4, 2), (4, 4), (20, 2)]
