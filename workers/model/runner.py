"""``ModelRunner``: one batched forward over a mixed batch of prefills and decodes.

The runner owns no scheduling and no block allocation. The caller (the engine)
decides what runs and hands over, per sequence, the new token ids, how many tokens
are already cached, and a block table it has allocated; the runner lays the batch
out, writes the new tokens' K/V into their slots and returns next-token logits.
Decode steps that captured graphs hold (``workers.model.decode_graphs``) replay them;
everything else (prefill chunks, mixed batches, larger batches) runs eagerly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import torch

from workers.attention.backend import LayerKVCache
from workers.attention.metadata import AttentionMetadata, int_tensor
from workers.kv.scales import KVScales
from workers.lora.segments import LoraSegments, segments_from_rows
from workers.lora.weights import LoraWeights
from workers.model.decode_graphs import DecodeGraphs, GraphCapture
from workers.model.llama import LlamaForCausalLM
from workers.model.step_input import StepInput

_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
_HALF = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class GraphPlan:
    """Decode graphs for a runner: how to capture them, and the most sequences and
    tokens per sequence a decode step they replay may have."""

    capture: GraphCapture
    max_num_seqs: int
    max_model_len: int


class ModelRunner:
    """Runs ``LlamaForCausalLM`` over per-layer paged caches.

    ``key_caches[i]``/``value_caches[i]`` are layer ``i``'s tensors shaped
    ``[num_blocks, block_size, num_kv_heads, head_dim]`` on the model's device, in
    its dtype or in an FP8 dtype stored with ``scales`` (default: unit scales, the only
    ones a cache in the model's dtype accepts). They are mutated in place by
    ``execute`` (only the slots of new tokens). ``lora`` holds the adapter slots that
    entries with a ``lora_slot`` run (None: LoRA off). ``graphs`` captures decode
    steps at construction, with and without adapters when ``lora`` is set (None, or a
    model with dynamic-NTK RoPE, whose frequencies depend on a host-side check: every
    step eager).
    """

    def __init__(
        self,
        model: LlamaForCausalLM,
        key_caches: Sequence[torch.Tensor],
        value_caches: Sequence[torch.Tensor],
        block_size: int,
        scales: KVScales | None = None,
        lora: LoraWeights | None = None,
        graphs: GraphPlan | None = None,
    ) -> None:
        config, weight = model.config, model.lm_head.weight
        _check_caches(key_caches, value_caches, block_size, model)
        scales = scales or KVScales.unit(config.num_hidden_layers)
        if scales.num_layers != config.num_hidden_layers:
            raise ValueError(f"{scales.num_layers} KV scales for {config.num_hidden_layers} layers")
        if key_caches[0].dtype not in _FP8 and not scales.is_unit:
            raise ValueError("KV scales other than unit need an FP8 cache")
        self.model = model
        self.lora = lora
        self.scales = scales
        self.caches = [
            LayerKVCache(key, value, *(() if layer is None else layer.to(weight.device)))
            for key, value, layer in zip(key_caches, value_caches, scales.layers, strict=True)
        ]
        self.block_size = block_size
        self.num_blocks = key_caches[0].shape[0]
        self.device = weight.device
        self.graphs = None if graphs is None or model.rotary.is_dynamic else DecodeGraphs(
            self._decode, graphs.capture, max_num_seqs=graphs.max_num_seqs,
            max_blocks_per_seq=-(-graphs.max_model_len // block_size), block_size=block_size,
            num_blocks=self.num_blocks, device=self.device, adapters=lora is not None)

    def execute(self, batch: Sequence[StepInput]) -> torch.Tensor:
        """Float32 logits [len(batch), vocab] for the last new token of each entry.

        Raises ValueError on an empty batch, an empty ``token_ids`` or a block table
        that is too short or names a block outside the cache. A replayed step's logits
        are valid until the next call.
        """
        if self.graphs is not None and batch and self.graphs.runs(batch):
            with torch.inference_mode():
                return self.graphs.execute(batch)
        metadata = AttentionMetadata.build(
            [len(step.token_ids) for step in batch],
            [step.num_computed_tokens for step in batch],
            [step.block_table for step in batch],
            self.block_size,
            self.num_blocks,
            self.device,
        )
        input_ids = int_tensor("q", list(chain.from_iterable(step.token_ids for step in batch)),
                               self.device)
        lora_batch = None
        if self.lora is not None and any(step.lora_slot is not None for step in batch):
            segments = segments_from_rows([len(step.token_ids) for step in batch],
                                          [step.lora_slot for step in batch], self.device)
            lora_batch = self.lora.batch(segments, len(input_ids))
        with torch.inference_mode():
            hidden = self.model(input_ids, self.caches, metadata, lora_batch)
            if metadata.max_query_len > 1:  # else token b is sequence b's last already
                hidden = hidden[metadata.last_token_indices]
            return self.model.compute_logits(hidden)

    def _decode(self, input_ids: torch.Tensor, metadata: AttentionMetadata,
                runs: LoraSegments | None) -> torch.Tensor:
        """Logits of a decode step (one token per sequence), adding the adapters' deltas
        to the rows of ``runs``: what the graphs capture."""
        lora_batch = None
        if runs is not None and self.lora is not None:
            lora_batch = self.lora.batch(runs, input_ids.shape[0])
        with torch.inference_mode():
            hidden = self.model(input_ids, self.caches, metadata, lora_batch)
            return self.model.compute_logits(hidden)


def _check_caches(key_caches: Sequence[torch.Tensor], value_caches: Sequence[torch.Tensor],
                  block_size: int, model: LlamaForCausalLM) -> None:
    """Raise ValueError unless there is a key and a value cache per layer of ``model``,
    each with the paged layout for it, on its device, in its dtype or an FP8 one (or,
    on the CPU, where the torch reference reads any cache into the query's dtype, a
    16-bit one: a GPU's bf16 KV cache beside a float32 model)."""
    config, weight = model.config, model.lm_head.weight
    if not len(key_caches) == len(value_caches) == config.num_hidden_layers:
        raise ValueError(
            f"need {config.num_hidden_layers} key and value caches, got "
            f"{len(key_caches)} and {len(value_caches)}"
        )
    for layer, (key, value) in enumerate(zip(key_caches, value_caches, strict=True)):
        expected = (key.shape[0], block_size, config.num_key_value_heads, config.head_dim)
        for name, cache in (("key", key), ("value", value)):
            if tuple(cache.shape) != expected:
                raise ValueError(
                    f"layer {layer} {name} cache: shape {tuple(cache.shape)}, expected {expected}"
                )
            narrower = cache.dtype in _FP8 or (weight.device.type == "cpu"
                                               and cache.dtype in _HALF)
            if cache.dtype != key.dtype:
                raise ValueError(f"layer {layer} value cache: {cache.dtype}, its key cache "
                                 f"{key.dtype}")
            if (cache.dtype != weight.dtype and not narrower) or cache.device != weight.device:
                raise ValueError(
                    f"layer {layer} {name} cache: {cache.dtype} on {cache.device}, model is "
                    f"{weight.dtype} on {weight.device}"
                )
