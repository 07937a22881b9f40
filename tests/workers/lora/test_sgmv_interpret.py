"""The Triton LoRA delta == the torch reference, on the CPU through the Triton interpreter.

The hypothesis properties run in one subprocess with ``TRITON_INTERPRET=1`` (see
sgmv_interpret_cases.py); each dtype is reported as its own test here.
"""

from __future__ import annotations

import pytest

from tests.support.triton_interpreter import run_cases_module

# Its module-scoped processes start once: the whole module runs on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("sgmv_interpret")]

pytest.importorskip("triton")

CASES_MODULE = "tests.workers.lora.sgmv_interpret_cases"
DTYPE_NAMES = ["float32", "float16", "bfloat16"]


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    results, stdout = run_cases_module(CASES_MODULE)
    return {"stdout": stdout, **results}


@pytest.mark.parametrize("dtype_name", DTYPE_NAMES)
def test_triton_matches_reference(results, dtype_name):
    assert results[dtype_name] == "ok", results["stdout"][-4000:]
