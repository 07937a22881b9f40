"""Fused Triton kernels == torch reference, on the CPU through the Triton interpreter.

The cases run in one subprocess with ``TRITON_INTERPRET=1`` (see
fused_interpret_cases.py); each case is reported as its own test here.
"""

from __future__ import annotations

import pytest

from tests.support.triton_interpreter import error_suite

# Its module-scoped process starts once: the whole module runs on one xdist worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("fused_interpret")]

pytest.importorskip("triton")

CASES_MODULE = "tests.workers.fused.fused_interpret_cases"
DTYPES = ("float32", "bfloat16")
CASE_NAMES = [
    *(
        name
        for dt in DTYPES
        for n in (24, 40, 2048)
        for name in (
            f"rms_norm-{dt}-n{n}", f"add_rms_norm-{dt}-n{n}-normed", f"add_rms_norm-{dt}-n{n}-summed"
        )
    ),
    *(
        f"rotary-{dt}-{shape}"
        for dt in DTYPES
        for shape in ("h3-kv1-d16-qkv-views", "h4-kv2-d24-qkv-views", "h2-kv2-d64-contiguous")
    ),
    *(
        f"silu_and_mul-{dt}-{shape}"
        for dt in DTYPES
        for shape in ("n24-contiguous", "n40-gate-up-views", "n5632-gate-up-views")
    ),
    "rejects-bad-arguments",
]

# float32: the kernels and torch differ only in summation order, rsqrt/exp and FMA
# contraction, a few float32 ulps of values below 4 (about 1e-6).
FLOAT32_TOLERANCE = 2e-5
# bfloat16: every case keeps its outputs below 4, where one bf16 ulp is 2**-6. On a GPU the
# kernel's float32 -> bf16 casts round to nearest as torch's do, but the interpreter's
# cast truncates (toward zero), so each rounding step may land one ulp off torch's
# instead of half an ulp. With up to three steps in series (add_rms_norm: the sum, the
# normalized value, the product with the weight) that bounds the difference by about
# four ulps; 2**-5 (two ulps) is observed. A real bug (wrong rotate-half partner or
# sign, a missing weight or residual) errs by O(1).
BFLOAT16_TOLERANCE = 4 * 2**-6

results, test_every_case_ran, test_triton_matches_reference = error_suite(
    CASES_MODULE, CASE_NAMES,
    lambda name: BFLOAT16_TOLERANCE if "bfloat16" in name else FLOAT32_TOLERANCE)
