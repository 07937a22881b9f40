"""``ModelConfig``: the architecture of a Llama-family checkpoint, parsed from config.json.

Both config.json dialects are read: the legacy one (``rope_theta`` plus a
``rope_scaling`` dict keyed by ``type`` or ``rope_type``) and the transformers 5 one
(a ``rope_parameters`` dict holding ``rope_theta`` and ``rope_type``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
ROPE_TYPES = ("linear", "dynamic", "llama3", "yarn")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class RopeScaling:
    """A RoPE scaling variant with every parameter it reads, defaults filled in as
    transformers fills them (``original_max_position_embeddings`` falls back to
    ``max_position_embeddings`` for llama3 and yarn, a config-level value wins; a
    missing yarn ``factor`` is max positions / original max positions)."""

    rope_type: str
    factor: float
    original_max_position_embeddings: int | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    attention_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True


@dataclass(frozen=True)
class ModelConfig:
    """The decoder's shape and numerics. Every field is validated on parse."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    o_proj_bias: bool
    mlp_bias: bool
    dtype: torch.dtype

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        """Parse a config.json; ValueError naming the file (and field) when it is invalid."""
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"{path}: missing model config")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: invalid JSON: {exc}") from exc
        try:
            return cls.from_dict(raw)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        """Parse the parsed JSON of a config.json; ValueError naming the bad field."""
        if not isinstance(raw, dict):
            raise ValueError("config must be a JSON object")
        architectures = raw.get("architectures") or ["LlamaForCausalLM"]
        architecture = architectures[0] if isinstance(architectures, list) else architectures
        if architecture not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"architectures: {architecture!r} is not one of {SUPPORTED_ARCHITECTURES}"
            )
        if raw.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act: only 'silu' is supported, got {raw['hidden_act']!r}")
        if raw.get("use_sliding_window"):
            raise ValueError("use_sliding_window: sliding-window attention is not supported")
        heads = _positive_int(raw, "num_attention_heads")
        hidden = _positive_int(raw, "hidden_size")
        kv_heads = _positive_int(raw, "num_key_value_heads", default=heads)
        if heads % kv_heads:
            raise ValueError(f"num_key_value_heads: {kv_heads} does not divide {heads} heads")
        head_dim = raw.get("head_dim") or hidden // heads
        if not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
            raise ValueError(f"head_dim: must be a positive even int, got {head_dim!r}")
        max_positions = _positive_int(raw, "max_position_embeddings", default=2048)
        theta, scaling = _parse_rope(raw, max_positions)
        is_qwen2 = architecture == "Qwen2ForCausalLM"
        attention_bias = _bool(raw, "attention_bias", default=False)
        return cls(
            architecture=architecture,
            vocab_size=_positive_int(raw, "vocab_size"),
            hidden_size=hidden,
            intermediate_size=_positive_int(raw, "intermediate_size"),
            num_hidden_layers=_positive_int(raw, "num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=_positive_float(raw, "rms_norm_eps", default=1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=max_positions,
            tie_word_embeddings=_bool(raw, "tie_word_embeddings", default=False),
            attention_bias=is_qwen2 or attention_bias,
            o_proj_bias=not is_qwen2 and attention_bias,
            mlp_bias=not is_qwen2 and _bool(raw, "mlp_bias", default=False),
            dtype=_parse_dtype(raw),
        )

    @property
    def num_queries_per_kv(self) -> int:
        """Query heads sharing one KV head (1 for multi-head attention)."""
        return self.num_attention_heads // self.num_key_value_heads

    def rope_fingerprint(self) -> dict[str, Any]:
        """Canonical RoPE description for the cache namespace: equal dicts mean equal
        rotations at every position, so cached keys are interchangeable."""
        scaling = None
        if self.rope_scaling is not None:
            scaling = {k: v for k, v in asdict(self.rope_scaling).items() if v is not None}
        return {
            "rope_theta": self.rope_theta,
            "rope_scaling": scaling,
            "max_position_embeddings": self.max_position_embeddings,
        }


def _parse_rope(raw: dict[str, Any], max_positions: int) -> tuple[float, RopeScaling | None]:
    """RoPE's base and scaling (None: plain RoPE) from ``rope_parameters``, else
    ``rope_scaling``, else the top-level fields; raises ValueError for a malformed or
    unsupported one (per-layer-type, partial rotary, an unknown ``rope_type``)."""
    params, field = _rope_params(raw)
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    if not isinstance(theta, (int, float)) or theta <= 0:
        raise ValueError(f"rope_theta: must be a positive number, got {theta!r}")
    if params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("partial_rotary_factor: partial rotary embeddings are not supported")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return float(theta), None
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"{field}.rope_type: {rope_type!r} is not one of {('default', *ROPE_TYPES)}"
        )
    return float(theta), _rope_scaling(raw, params, field, rope_type, max_positions)


def _rope_params(raw: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The RoPE parameters object ({} if none) and the field it came from."""
    params = raw.get("rope_parameters")
    field = "rope_parameters"
    if params is None:
        params, field = raw.get("rope_scaling"), "rope_scaling"
    params = params or {}
    if not isinstance(params, dict):
        raise ValueError(f"{field}: must be an object")
    if any(isinstance(v, dict) for v in params.values()):
        raise ValueError(f"{field}: per-layer-type RoPE is not supported")
    return params, field


def _rope_scaling(raw: dict[str, Any], params: dict[str, Any], field: str, rope_type: str,
                  max_positions: int) -> RopeScaling:
    """The scaling of a ``rope_type`` in ``ROPE_TYPES``, checked."""
    original = None
    if rope_type in ("llama3", "yarn"):
        original = raw.get(
            "original_max_position_embeddings",
            params.get("original_max_position_embeddings", max_positions),
        )
        if not isinstance(original, int) or original <= 0:
            raise ValueError(f"{field}.original_max_position_embeddings: must be a positive int")
    factor = params.get("factor")
    if factor is None and rope_type == "yarn":
        factor = max_positions / original
    if not isinstance(factor, (int, float)) or factor < 1.0:
        raise ValueError(f"{field}.factor: must be a number >= 1, got {factor!r}")
    if rope_type == "llama3":
        for key in ("low_freq_factor", "high_freq_factor"):
            if not isinstance(params.get(key), (int, float)):
                raise ValueError(f"{field}.{key}: required number for rope_type 'llama3'")
    optional = (
        "low_freq_factor",
        "high_freq_factor",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
    )
    return RopeScaling(
        rope_type=rope_type,
        factor=float(factor),
        original_max_position_embeddings=original,
        truncate=bool(params.get("truncate", True)),
        **{key: None if params.get(key) is None else float(params[key]) for key in optional},
    )


def _parse_dtype(raw: dict[str, Any]) -> torch.dtype:
    name = raw.get("torch_dtype", raw.get("dtype", "float32")) or "float32"
    if name not in _DTYPES:
        raise ValueError(f"torch_dtype: {name!r} is not one of {tuple(_DTYPES)}")
    return _DTYPES[name]


def _positive_int(raw: dict[str, Any], key: str, default: int | None = None) -> int:
    value = raw.get(key, default)
    if value is None:
        raise ValueError(f"{key}: required field is missing")
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{key}: must be a positive int, got {value!r}")
    return value


def _positive_float(raw: dict[str, Any], key: str, default: float) -> float:
    value = raw.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{key}: must be a positive number, got {value!r}")
    return float(value)


def _bool(raw: dict[str, Any], key: str, default: bool) -> bool:
    value = raw.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"{key}: must be true or false, got {value!r}")
    return value
