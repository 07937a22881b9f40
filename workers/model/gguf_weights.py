"""A Llama-family GGUF file as a model config and a dequantized state dict.

``GGUFCheckpoint.open`` reads the metadata into the config.json fields
``ModelConfig.from_dict`` parses (so both formats pass the same checks), and
``state_dict`` dequantizes every tensor with the ``gguf`` package's own
dequantizers into the compute dtype under its transformers name. llama.cpp's
converter permutes the rows of the query and key projections (it pairs rotary
halves as interleaved rows); ``unpermute_rows`` undoes it, as transformers does
when it loads a GGUF. Errors name the file and the tensor, type or key.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.quants import dequantize

from radix.gguf_tokenizer import gguf_tokenizer, read_gguf
from radix.tokenizer import PromptTokenizer

SUPPORTED_ARCHITECTURES = ("llama",)
SUPPORTED_TYPES = frozenset(
    GGMLQuantizationType[name]
    for name in ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                 "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
)

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


@dataclass(frozen=True)
class GGUFCheckpoint:
    """An open GGUF file: its path, reader, config.json-style fields and tokenizer."""

    path: Path
    reader: GGUFReader
    config_fields: dict[str, Any]
    tokenizer: PromptTokenizer

    @classmethod
    def open(cls, path: str | Path) -> GGUFCheckpoint:
        """Read the metadata and tensor infos of ``path``; ValueError naming the file and
        the problem."""
        path = Path(path)

        def build(metadata: Mapping[str, Any]) -> GGUFCheckpoint:
            reader = GGUFReader(path)
            return cls(path, reader, config_fields(metadata, reader.tensors),
                       gguf_tokenizer(metadata))

        return read_gguf(path, build)

    def state_dict(
        self, expected: Mapping[str, tuple[int, ...]], dtype: torch.dtype, device: torch.device | str
    ) -> dict[str, torch.Tensor]:
        """Every tensor under its transformers name, dequantized to ``dtype`` on
        ``device``, checked against ``expected`` shapes (``lm_head.weight`` may be
        absent: tied embeddings). ValueError naming the tensor otherwise."""
        heads = self.config_fields["num_attention_heads"]
        kv_heads = self.config_fields["num_key_value_heads"]
        state: dict[str, torch.Tensor] = {}
        for tensor in self.reader.tensors:
            name = hf_tensor_name(tensor.name)
            if name is None or name not in expected:
                raise ValueError(f"{self.path}: unexpected tensor {tensor.name!r}")
            values = _dequantized(tensor, self.path)
            if name.endswith(("q_proj.weight", "q_proj.bias")):
                values = unpermute_rows(values, heads)
            elif name.endswith(("k_proj.weight", "k_proj.bias")):
                values = unpermute_rows(values, kv_heads)
            if values.shape != expected[name]:
                raise ValueError(
                    f"{self.path}: tensor {tensor.name!r} has shape {values.shape}, the "
                    f"metadata implies {expected[name]}"
                )
            state[name] = torch.from_numpy(values).to(device=device, dtype=dtype)
        missing = [n for n in expected if n not in state and n != "lm_head.weight"]
        if missing:
            raise ValueError(f"{self.path}: tensor for {missing[0]!r} is missing")
        return state


def config_fields(metadata: Mapping[str, Any], tensor_infos: Sequence[ReaderTensor]
                  ) -> dict[str, Any]:
    """The config.json fields of a Llama GGUF (``ModelConfig.from_dict`` input)."""
    arch = metadata.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"general.architecture {arch!r} is not supported ({SUPPORTED_ARCHITECTURES})")

    def get(key: str, default: Any = None) -> Any:
        value = metadata.get(f"{arch}.{key}", default)
        if value is None:
            raise ValueError(f"{arch}.{key}: required metadata is missing")
        return value

    tensors = {t.name: t for t in tensor_infos}
    if "rope_freqs.weight" in tensors:
        raise ValueError("tensor 'rope_freqs.weight': per-dimension RoPE factors are not supported")
    embedding = tensors.get("token_embd.weight")
    if embedding is None:
        raise ValueError("tensor 'token_embd.weight' is missing")
    heads = get("attention.head_count")
    hidden = get("embedding_length")
    head_dim = metadata.get(f"{arch}.attention.key_length", hidden // heads)
    if metadata.get(f"{arch}.rope.dimension_count", head_dim) != head_dim:
        raise ValueError(f"{arch}.rope.dimension_count: partial rotary embeddings are not supported")
    return {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": int(embedding.shape[-1]),
        "hidden_size": hidden,
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads),
        "head_dim": head_dim,
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon"),
        "rope_theta": get("rope.freq_base", 10000.0),
        "rope_scaling": _rope_scaling(metadata, arch),
        "max_position_embeddings": get("context_length"),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors,
        "torch_dtype": "float32",
    }


def hf_tensor_name(gguf_name: str) -> str | None:
    """The transformers name of a llama.cpp tensor name, None if it has none."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    return None


def unpermute_rows(values: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation: within each head, rows stored as
    interleaved (pair, half) go back to (half, pair) order. Works on weights and biases."""
    rows = values.shape[0]
    grouped = values.reshape(num_heads, rows // num_heads // 2, 2, *values.shape[1:])
    return np.ascontiguousarray(grouped.swapaxes(1, 2).reshape(values.shape))


def _dequantized(tensor: ReaderTensor, path: Path) -> np.ndarray:
    """float32 values in row-major (transformers) shape; GGUF lists dims fastest first."""
    if tensor.tensor_type not in SUPPORTED_TYPES:
        raise ValueError(
            f"{path}: tensor {tensor.name!r} has type {tensor.tensor_type.name}, not one of "
            f"{sorted(t.name for t in SUPPORTED_TYPES)}"
        )
    shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
    values = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    # F32 tensors come back as views of the read-only memory map: copy those.
    return (values if values.flags.writeable else values.copy()).reshape(shape)


def _rope_scaling(metadata: Mapping[str, Any], arch: str) -> dict[str, Any] | None:
    kind = metadata.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    factor = metadata.get(f"{arch}.rope.scaling.factor")
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        original = metadata.get(f"{arch}.rope.scaling.original_context_length")
        return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original}
    raise ValueError(f"{arch}.rope.scaling.type {kind!r} is not supported (none, linear, yarn)")
