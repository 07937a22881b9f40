"""The KV cache dtypes, by the torch names a worker reports (``/ready``'s ``kv_dtype``,
the cache namespace's ``kv_dtype``), their byte sizes and the aliases flags accept.

Both sides read them: a worker to size and name its cache (``workers.kv.spec``), a
router to check a model's expected KV dtype (``router.fleet.expectations``).
"""

from __future__ import annotations

ELEMENT_BYTES = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
}
FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")
DTYPE_ALIASES = {
    "fp32": "float32",
    "float": "float32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}
KV_DTYPE_NAMES = (*ELEMENT_BYTES, *DTYPE_ALIASES)


def canonical_dtype(name: str) -> str:
    """The torch name of a KV dtype (``bf16`` -> ``bfloat16``); ValueError if unknown."""
    name = DTYPE_ALIASES.get(name, name)
    if name not in ELEMENT_BYTES:
        raise ValueError(f"KVCacheSpec.dtype must be one of {sorted(KV_DTYPE_NAMES)}, "
                         f"got {name!r}")
    return name
