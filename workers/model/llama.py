"""Llama-family decoder over a paged KV cache (Llama 2/3, Qwen2-style QKV bias).

Parameter names equal the Hugging Face checkpoint names, so loading is a checked
``load_state_dict``. The batch is flattened: ``[num_tokens, hidden]`` activations,
no padding; ``AttentionMetadata`` says which sequence and position each token is.
Attention layers own no cache: each call writes the new tokens' K/V into the
layer's cache tensors it is handed and runs paged attention over them. With a
``LoraBatch`` every projection adds its LoRA delta for the adapter rows of the batch
(``workers.lora.weights``); the base weights are never changed.

The residual stream is carried beside the hidden states, as vLLM does: each norm
adds the block's output to the residual and normalizes the sum in one call
(``workers.fused.ops.add_rms_norm``), which on CUDA is one kernel instead of seven
and on the CPU is transformers' arithmetic operation for operation (same sums, same
order), so greedy output still equals transformers'.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from workers.attention.backend import LayerKVCache, paged_attention, write_kv
from workers.attention.metadata import AttentionMetadata
from workers.fused import ops
from workers.lora.weights import LoraBatch
from workers.model.config import ModelConfig
from workers.model.merged import MergedProjection, merge_linears
from workers.model.rope import RotaryEmbedding

RopeTables = tuple[torch.Tensor, torch.Tensor]
QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")


def _project(owner: nn.Module, name: str, layer: int, x: torch.Tensor,
             lora: LoraBatch | None) -> torch.Tensor:
    """The projection ``owner.<name>`` of ``x``, plus its LoRA delta when there is one."""
    out = getattr(owner, name)(x)
    return out if lora is None else lora.add(layer, name, x, out)


def _project_all(owner: nn.Module, names: tuple[str, ...], merged: MergedProjection | None,
                 layer: int, x: torch.Tensor, lora: LoraBatch | None) -> list[torch.Tensor]:
    """The projections ``names`` of ``x`` (one GEMM when ``merged``), each plus its LoRA
    delta when there is one."""
    if merged is None:
        return [_project(owner, name, layer, x, lora) for name in names]
    outs = merged(x)
    if lora is None:
        return list(outs)
    return [lora.add(layer, name, x, out) for name, out in zip(names, outs, strict=True)]


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, as transformers' ``LlamaRMSNorm``."""

    def __init__(self, size: int, eps: float, **factory: Any) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, **factory))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalize the last dimension of ``x``; the result keeps ``x``'s dtype."""
        return ops.rms_norm(x, self.weight, self.eps)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm of ``residual + x``, ``residual + x``); ``x`` and ``residual`` may be
        overwritten (on CUDA they are: the kernel works in place)."""
        return ops.add_rms_norm(x, residual, self.weight, self.eps)


class Attention(nn.Module):
    """Grouped-query self-attention reading and writing one layer's paged cache."""

    def __init__(self, config: ModelConfig, layer_index: int, **factory: Any) -> None:
        super().__init__()
        self.layer_index = layer_index
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
        self.qkv: MergedProjection | None = None

    def merge_projections(self) -> None:
        """Compute q, k and v with one GEMM from now on (``workers.model.merged``)."""
        if self.qkv is None:
            self.qkv = merge_linears(self, QKV)

    def forward(
        self,
        hidden: torch.Tensor,
        rope: RopeTables,
        cache: LayerKVCache,
        metadata: AttentionMetadata,
        lora: LoraBatch | None = None,
    ) -> torch.Tensor:
        """Attend ``hidden`` [T, hidden] over the cache after storing its own K/V there."""
        num_tokens, layer = hidden.shape[0], self.layer_index
        query, key, value = _project_all(self, QKV, self.qkv, layer, hidden, lora)
        query = query.view(num_tokens, self.num_heads, self.head_dim)
        key = key.view(num_tokens, self.num_kv_heads, self.head_dim)
        value = value.view(num_tokens, self.num_kv_heads, self.head_dim)
        query, key = ops.rotary(query, key, *rope)
        write_kv(cache, key, value, metadata.slot_mapping)
        out = paged_attention(query, cache, metadata, self.scale)
        out = out.reshape(num_tokens, self.num_heads * self.head_dim)
        return _project(self, "o_proj", layer, out, lora)


class MLP(nn.Module):
    """SwiGLU feed-forward: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: ModelConfig, layer_index: int, **factory: Any) -> None:
        super().__init__()
        self.layer_index = layer_index
        hidden, inner, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(hidden, inner, bias=bias, **factory)
        self.up_proj = nn.Linear(hidden, inner, bias=bias, **factory)
        self.down_proj = nn.Linear(inner, hidden, bias=bias, **factory)
        self.gate_up: MergedProjection | None = None

    def merge_projections(self) -> None:
        """Compute gate and up with one GEMM from now on (``workers.model.merged``)."""
        if self.gate_up is None:
            self.gate_up = merge_linears(self, GATE_UP)

    def forward(self, x: torch.Tensor, lora: LoraBatch | None = None) -> torch.Tensor:
        """Apply the feed-forward block to ``x`` [T, hidden]."""
        layer = self.layer_index
        gate, up = _project_all(self, GATE_UP, self.gate_up, layer, x, lora)
        return _project(self, "down_proj", layer, ops.silu_and_mul(gate, up), lora)


class DecoderLayer(nn.Module):
    """Pre-norm residual block: attention then MLP, with the residual carried apart."""

    def __init__(self, config: ModelConfig, layer_index: int, **factory: Any) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_index, **factory)
        self.mlp = MLP(config, layer_index, **factory)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **factory)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, **factory)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        rope: RopeTables,
        cache: LayerKVCache,
        metadata: AttentionMetadata,
        lora: LoraBatch | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One decoder block over the flattened batch: (block output, residual), whose
        sum is the block's output stream. The first layer gets ``residual`` None."""
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm.add(hidden, residual)
        hidden = self.self_attn(hidden, rope, cache, metadata, lora)
        hidden, residual = self.post_attention_layernorm.add(hidden, residual)
        return self.mlp(hidden, lora), residual


class LlamaModel(nn.Module):
    """Embeddings, decoder layers and final norm (the HF ``model.`` prefix)."""

    def __init__(self, config: ModelConfig, **factory: Any) -> None:
        super().__init__()
        # nn.Embedding draws its own normal init; on the loader's meta device that init
        # is a Python reference that imports torch._dynamo (1.5 s of CPU per process).
        weight = torch.empty(config.vocab_size, config.hidden_size, **factory)
        if weight.device.type != "meta":
            nn.init.normal_(weight)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=weight)
        self.layers = nn.ModuleList(
            DecoderLayer(config, index, **factory) for index in range(config.num_hidden_layers)
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
        lora: LoraBatch | None = None,
    ) -> torch.Tensor:
        """Hidden states [T, hidden] of the new tokens ``input_ids`` [T], writing their
        K/V into ``caches`` (one ``LayerKVCache`` per layer) at ``metadata.slot_mapping``;
        ``lora`` adds the adapters' deltas to their rows."""
        if len(caches) != len(self.model.layers):
            raise ValueError(f"{len(caches)} caches for {len(self.model.layers)} layers")
        hidden = self.model.embed_tokens(input_ids)
        rope = self.rotary(metadata.positions, hidden.dtype)
        residual = None
        for layer, cache in zip(self.model.layers, caches, strict=True):
            hidden, residual = layer(hidden, residual, rope, cache, metadata, lora)
        assert residual is not None  # a model has at least one layer
        return self.model.norm.add(hidden, residual)[0]

    def merge_projections(self) -> None:
        """Every layer computes q/k/v and gate/up as one GEMM each from now on; the
        parameters keep their names, values and memory (``workers.model.merged``).
        The loader does it on CUDA; the CPU keeps transformers' separate GEMMs, whose
        rounding the greedy-equality tests hold it to."""
        for layer in self.model.layers:
            layer.self_attn.merge_projections()
            layer.mlp.merge_projections()

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits [N, vocab] of hidden states [N, hidden]."""
        return self.lm_head(hidden).float()
