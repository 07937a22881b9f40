"""Triton kernels == torch reference, on the CPU through the Triton interpreter.

The cases run in one subprocess with ``TRITON_INTERPRET=1`` (see
triton_interpret_cases.py); each case is reported as its own test here.
"""

from __future__ import annotations

import pytest

from tests.support.triton_interpreter import error_suite

# Its module-scoped processes start once: the whole module runs on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("triton_interpret")]

pytest.importorskip("triton")

CASES_MODULE = "tests.workers.attention.triton_interpret_cases"
CASE_NAMES = [
    *(
        f"{kind}-bs{bs}-h{h}-kv{kv}{suffix}"
        for bs in (16, 32)
        for h, kv in ((4, 4), (4, 2), (8, 1))
        for kind, suffix in [("prefill", "")] + [("decode", f"-splits{s}") for s in (1, 3, None)]
    ),
    "prefill-head-dim-24",
    "prefill-bs16-tile16",
    "prefill-bs8-tile32",
    "decode-bs32-tile16-splits3",
    "decode-bs8-splits2",
    "store-kv",
    "store-kv-padding-slots",
    "decode-padding-rows",
    "decode-stale-nan-slots",
    "rejects-non-contiguous-cache",
    *(
        f"fp8-{fmt}-{kind}"
        for fmt in ("e4m3", "e5m2")
        for kind in ("prefill", "store-kv", "decode-splits1", "decode-splits3")
    ),
    "fp8-rejects-bad-scales",
]

results, test_every_case_ran, test_triton_matches_reference = error_suite(
    CASES_MODULE, CASE_NAMES, lambda _name: 2e-5)
