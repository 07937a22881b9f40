"""Llama-family decoder over a paged KV cache (Llama 2/3, Qwen2-style QKV bias).

Parameter names equal the Hugging Face checkpoint names, so loading is a checked
``load_state_dict``. The batch is flattened: ``[num_tokens, hidden]`` activations,
no padding; ``AttentionMetadata`` says which sequence and position each token is.
Attention layers own no cache: each call writes the new tokens' K/V into the
layer's cache tensors it is handed and runs paged attention over them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from workers.attention.backend import LayerKVCache, paged_attention, write_kv
from workers.attention.metadata import AttentionMetadata
from workers.model.config import ModelConfig
from workers.model.rope import RotaryEmbedding, apply_rotary

RopeTables = tuple[torch.Tensor, torch.Tensor]


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, as transformers' ``LlamaRMSNorm``."""

    def __init__(self, size: int, eps: float, **factory: Any) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, **factory))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize the last dimension of ``x``; the result keeps ``x``'s dtype."""
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class Attention(nn.Module):
    """Grouped-query self-attention reading and writing one layer's paged cache."""

    def __init__(self, config: ModelConfig, **factory: Any) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        hidden, q_size = config.hidden_size, config.num_attention_heads * config.head_dim
        kv_size = config.num_key_value_heads * config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(hidden, q_size, bias=bias, **factory)
        self.k_proj = nn.Linear(hidden, kv_size, bias=bias, **factory)
        self.v_proj = nn.Linear(hidden, kv_size, bias=bias, **factory)
        self.o_proj = nn.Linear(q_size, hidden, bias=config.o_proj_bias, **factory)

    def forward(
        self,
        hidden: torch.Tensor,
        rope: RopeTables,
        cache: LayerKVCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """Attend ``hidden`` [T, hidden] over the cache after storing its own K/V there."""
        num_tokens = hidden.shape[0]
        query = self.q_proj(hidden).view(num_tokens, self.num_heads, self.head_dim)
        key = self.k_proj(hidden).view(num_tokens, self.num_kv_heads, self.head_dim)
        value = self.v_proj(hidden).view(num_tokens, self.num_kv_heads, self.head_dim)
        query, key = apply_rotary(query, *rope), apply_rotary(key, *rope)
        write_kv(cache, key, value, metadata.slot_mapping)
        out = paged_attention(query, cache, metadata, self.scale)
        return self.o_proj(out.reshape(num_tokens, self.num_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: ModelConfig, **factory: Any) -> None:
        super().__init__()
        hidden, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(hidden, inner, bias=bias, **factory)
        self.up_proj = nn.Linear(hidden, inner, bias=bias, **factory)
        self.down_proj = nn.Linear(inner, hidden, bias=bias, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the feed-forward block to ``x`` [T, hidden]."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """Pre-norm residual block: attention then MLP."""

    def __init__(self, config: ModelConfig, **factory: Any) -> None:
        super().__init__()
        self.self_attn = Attention(config, **factory)
        self.mlp = MLP(config, **factory)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **factory)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **factory)

    def forward(
        self,
        hidden: torch.Tensor,
        rope: RopeTables,
        cache: LayerKVCache,
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """One decoder block over the flattened batch."""
        hidden = hidden + self.self_attn(self.input_layernorm(hidden), rope, cache, metadata)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class LlamaModel(nn.Module):
    """Embeddings, decoder layers and final norm (the HF ``model.`` prefix)."""

    def __init__(self, config: ModelConfig, **factory: Any) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, **factory)
        self.layers = nn.ModuleList(
            DecoderLayer(config, **factory) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, **factory)


class LlamaForCausalLM(nn.Module):
    """The full causal LM. ``forward`` returns final hidden states of every new token;
    ``compute_logits`` maps chosen rows to float32 vocabulary logits.

    Parameters are created on the current default device (the loader builds on
    ``meta`` and assigns the checkpoint's tensors, then calls ``tie_weights``).
    """

    def __init__(self, config: ModelConfig, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        factory = {"dtype": dtype or config.dtype}
        self.config = config
        self.model = LlamaModel(config, **factory)
        self.rotary = RotaryEmbedding(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False, **factory)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Make ``lm_head`` share the embedding matrix when the config ties them."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,
        caches: Sequence[LayerKVCache],
        metadata: AttentionMetadata,
    ) -> torch.Tensor:
        """Hidden states [T, hidden] of the new tokens ``input_ids`` [T], writing their
        K/V into ``caches`` (one ``LayerKVCache`` per layer) at ``metadata.slot_mapping``."""
        if len(caches) != len(self.model.layers):
            raise ValueError(f"{len(caches)} caches for {len(self.model.layers)} layers")
        hidden = self.model.embed_tokens(input_ids)
        rope = self.rotary(metadata.positions, hidden.dtype)
        for layer, cache in zip(self.model.layers, caches, strict=True):
            hidden = layer(hidden, rope, cache, metadata)
        return self.model.norm(hidden)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits [N, vocab] of hidden states [N, hidden]."""
        return self.lm_head(hidden).float()
