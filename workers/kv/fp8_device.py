"""Which GPUs may hold an FP8 KV cache.

The FP8 conversions the Triton kernels compile to are instructions of compute
capability 8.9 and newer (Ada, Hopper, Blackwell); Triton has no ``float8_e4m3fn``
type below it. A worker refuses an FP8 cache (either format, one rule) on an older GPU
at start, with a message naming the capability, rather than fail at its first
request. A pure function of the capability, so the rule is tested without a GPU.
"""

from __future__ import annotations

MIN_FP8_CAPABILITY = (8, 9)


def fp8_device_problem(dtype: str, capability: tuple[int, int]) -> str | None:
    """Why a GPU of compute ``capability`` (``torch.cuda.get_device_capability``) cannot
    hold a KV cache of FP8 ``dtype`` (None: it can)."""
    if tuple(capability) >= MIN_FP8_CAPABILITY:
        return None
    major, minor = capability
    return (f"KV cache dtype {dtype} needs a GPU of compute capability "
            f"{MIN_FP8_CAPABILITY[0]}.{MIN_FP8_CAPABILITY[1]} or newer (Ada, Hopper, "
            f"Blackwell: FP8 conversions in hardware); this GPU is sm_{major}{minor}. Use "
            "--kv-cache-dtype auto on it")
