"""Rotary position embeddings: inverse frequencies and attention scaling per variant.

Each ``_*_inv_freq`` function repeats the float32 arithmetic of the matching entry
of transformers' ``ROPE_INIT_FUNCTIONS``, operation for operation, so the cos/sin
tables agree bit for bit on the CPU.

Dynamic NTK. transformers recomputes the frequencies of a forward pass from that
pass's largest position, and caches keys rotated with whatever frequencies were
current. That makes a key depend on how the sequence was chunked, which a shared
prefix cache cannot allow. Here every token uses the frequencies for
``seq_len = max(position + 1, max_position_embeddings)``: up to
``max_position_embeddings`` that is the unscaled RoPE (as in transformers), and in
token-by-token decoding past it, it is exactly what transformers computes. Only a
prefill chunk that crosses ``max_position_embeddings`` differs (transformers uses
the chunk's last position for all its tokens). A key is then a pure function of
(token, position), as the cache needs.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from workers.model.config import ModelConfig, RopeScaling


def inverse_frequencies(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim / 2] float32, cos/sin scaling) for positions below
    ``max_position_embeddings``, as transformers computes them at init."""
    dim = config.head_dim
    scaling = config.rope_scaling
    base = config.rope_theta
    if scaling is None:
        return _default_inv_freq(base, dim), 1.0
    if scaling.rope_type == "linear":
        return _default_inv_freq(base, dim) / scaling.factor, 1.0
    if scaling.rope_type == "dynamic":
        return _default_inv_freq(base, dim), 1.0
    if scaling.rope_type == "llama3":
        return _llama3_inv_freq(base, dim, scaling), 1.0
    return _yarn_inv_freq(base, dim, scaling), _yarn_attention_factor(scaling)


def dynamic_ntk_inv_freq(config: ModelConfig, seq_lens: torch.Tensor) -> torch.Tensor:
    """Per-token dynamic-NTK frequencies [num_tokens, head_dim / 2] for int64
    ``seq_lens`` (each at least ``max_position_embeddings``)."""
    assert config.rope_scaling is not None and config.rope_scaling.rope_type == "dynamic"
    dim = config.head_dim
    factor = config.rope_scaling.factor
    max_positions = config.max_position_embeddings
    base = config.rope_theta * ((factor * seq_lens / max_positions) - (factor - 1)) ** (
        dim / (dim - 2)
    )
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=seq_lens.device).float() / dim
    return 1.0 / (base[:, None] ** exponents[None, :])


class RotaryEmbedding(nn.Module):
    """Cos/sin tables of RoPE for given positions, computed once per forward pass.

    Guarantees: ``workers.fused.reference.apply_rotary(x, *rope(positions, dtype))``
    rotates ``x`` exactly as
    transformers' ``apply_rotary_pos_emb`` does (rotate-half layout, attention scaling
    folded into cos/sin). The frequencies are a plain float32 tensor, not a buffer:
    casting the model to a 16-bit dtype or building it on the meta device leaves them
    intact; they follow the positions' device on first use.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self._inv_freq, self.attention_scaling = inverse_frequencies(config)
        scaling = config.rope_scaling
        self.is_dynamic = scaling is not None and scaling.rope_type == "dynamic"

    def forward(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each [T, 1, head_dim] in ``dtype``, for int64 ``positions`` [T]."""
        if self._inv_freq.device != positions.device:
            self._inv_freq = self._inv_freq.to(positions.device)
        freqs = positions[:, None].float() * self._inv_freq[None, :]
        max_positions = self.config.max_position_embeddings
        if self.is_dynamic and bool((positions >= max_positions).any()):
            seq_lens = torch.clamp(positions + 1, min=max_positions)
            freqs = positions[:, None].float() * dynamic_ntk_inv_freq(self.config, seq_lens)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype)[:, None, :], sin.to(dtype)[:, None, :]


def _default_inv_freq(base: float, dim: int) -> torch.Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
    return 1.0 / (base**exponents)


def _llama3_inv_freq(base: float, dim: int, scaling: RopeScaling) -> torch.Tensor:
    inv_freq = _default_inv_freq(base, dim)
    assert scaling.low_freq_factor is not None and scaling.high_freq_factor is not None
    assert scaling.original_max_position_embeddings is not None
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    old_context_len = scaling.original_max_position_embeddings
    low_freq_wavelen = old_context_len / low
    high_freq_wavelen = old_context_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_inv_freq(base: float, dim: int, scaling: RopeScaling) -> torch.Tensor:
    assert scaling.original_max_position_embeddings is not None
    beta_fast = scaling.beta_fast or 32
    beta_slow = scaling.beta_slow or 1
    original = scaling.original_max_position_embeddings

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp(
        (torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low), 0, 1
    )
    pos_freqs = base ** (torch.arange(0, dim, 2, device="cpu").float() / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (scaling.factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor


def _yarn_attention_factor(scaling: RopeScaling) -> float:
    if scaling.attention_factor is not None:
        return scaling.attention_factor

    def mscale(scale: float, m: float = 1) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if scaling.mscale and scaling.mscale_all_dim:
        return float(
            mscale(scaling.factor, scaling.mscale) / mscale(scaling.factor, scaling.mscale_all_dim)
        )
    return mscale(scaling.factor)
