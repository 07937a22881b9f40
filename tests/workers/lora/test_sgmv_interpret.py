"""The Triton LoRA delta == the torch reference, on the CPU through the Triton interpreter.

The hypothesis properties run in one subprocess with ``TRITON_INTERPRET=1`` (see
sgmv_interpret_cases.py); each dtype is reported as its own test here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.procs import REPO_ROOT

# Its module-scoped processes start once: the whole module runs on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("sgmv_interpret")]

pytest.importorskip("triton")

CASES_MODULE = "tests.workers.lora.sgmv_interpret_cases"
DTYPE_NAMES = ["float32", "float16", "bfloat16"]


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(
        [sys.executable, "-m", CASES_MODULE], cwd=REPO_ROOT, env=env, capture_output=True,
        text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return {"stdout": done.stdout, **json.loads(done.stdout.strip().splitlines()[-1])}


@pytest.mark.parametrize("dtype_name", DTYPE_NAMES)
def test_triton_matches_reference(results, dtype_name):
    assert results[dtype_name] == "ok", results["stdout"][-4000:]
