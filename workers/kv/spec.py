"""The shape of the KV cache and the byte cost of one token and one block."""

from __future__ import annotations

from dataclasses import dataclass

from radix.kv_dtypes import ELEMENT_BYTES, FP8_DTYPES, canonical_dtype


@dataclass(frozen=True)
class KVCacheSpec:
    """What one KV block holds: ``block_size`` tokens of K and V for every layer.

    ``dtype`` is stored canonical (torch name); aliases such as ``bf16``, ``fp8``
    (float8_e4m3fn, one byte) and ``fp8_e5m2`` are accepted. An FP8 cache stores K and
    V divided by per-layer scales (``workers.kv.scales``). Every field is validated on construction.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str = "bfloat16"
    block_size: int = 16

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "block_size"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ValueError(f"KVCacheSpec.{name} must be a positive int, got {value!r}")
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))

    @property
    def bytes_per_element(self) -> int:
        """Bytes of one K or V element."""
        return ELEMENT_BYTES[self.dtype]

    @property
    def is_fp8(self) -> bool:
        """True for a float8 cache (quantized on store, dequantized in attention)."""
        return self.dtype in FP8_DTYPES

    @property
    def kv_bytes_per_token(self) -> int:
        """2 (K and V) x layers x kv heads x head dim x bytes per element."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.bytes_per_element

    @property
    def kv_bytes_per_block(self) -> int:
        """Bytes of one block across all layers, K and V."""
        return self.kv_bytes_per_token * self.block_size
