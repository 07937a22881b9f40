"""Tiny Llama GGUF files written the way llama.cpp's converter writes them, for tests.

``write_llama_gguf`` takes a transformers Llama model (the oracle) and a byte-level
BPE ``tokenizers.Tokenizer`` (``tests.support.bpe.trained_bpe``), and writes their GGUF with ``gguf.GGUFWriter``: Q/K
rows permuted as llama.cpp does, tensors stored in the types asked for (F32, F16 or
a quantized type from ``gguf.quants``), and the tokenizer as ``tokenizer.ggml.*``
metadata (specials typed as control tokens).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter, TokenType
from gguf.quants import quant_shape_to_byte_shape, quantize
from tokenizers import Tokenizer

from radix.tokenizer import DEMO_CHAT_TEMPLATE, DEMO_SPECIAL_TOKENS

_LAYER_PARTS = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_GLOBAL = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}

TensorType = Callable[[str], GGMLQuantizationType]


def mixed_types(gguf_name: str) -> GGMLQuantizationType:
    """Norms in F32, attention in F16, the rest (embeddings, MLP, head) in Q8_0."""
    if gguf_name.endswith("norm.weight"):
        return GGMLQuantizationType.F32
    if ".attn_" in gguf_name:
        return GGMLQuantizationType.F16
    return GGMLQuantizationType.Q8_0


def write_llama_gguf(
    path: Path,
    model: torch.nn.Module,
    tokenizer: Tokenizer,
    tensor_type: TensorType = mixed_types,
    architecture: str = "llama",
    add_bos_token: bool = True,
) -> Path:
    """Write ``model`` (a transformers LlamaForCausalLM) and ``tokenizer`` to ``path``."""
    config = model.config
    writer = GGUFWriter(str(path), architecture)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_vocab_size(config.vocab_size)
    _add_tokenizer(writer, tokenizer, add_bos_token)
    for name, tensor in model.state_dict().items():
        gguf_name = _gguf_name(name)
        if gguf_name is None or (name == "lm_head.weight" and config.tie_word_embeddings):
            continue
        values = tensor.detach().float().numpy()
        if gguf_name.endswith("attn_q.weight"):
            values = _permute(values, config.num_attention_heads)
        elif gguf_name.endswith("attn_k.weight"):
            values = _permute(values, config.num_key_value_heads)
        kind = tensor_type(gguf_name)
        if kind == GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name, values)
        elif kind == GGMLQuantizationType.F16:
            writer.add_tensor(gguf_name, values.astype(np.float16))
        else:
            writer.add_tensor(gguf_name, _quantized(values, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _quantized(values: np.ndarray, kind: GGMLQuantizationType) -> np.ndarray:
    """``values`` in ``kind``; zero blocks for types ``gguf`` cannot quantize (enough to
    test that a loader refuses them)."""
    try:
        return quantize(values, kind)
    except NotImplementedError:
        return np.zeros(quant_shape_to_byte_shape(values.shape, kind), dtype=np.uint8)


def _add_tokenizer(writer: GGUFWriter, tokenizer: Tokenizer, add_bos_token: bool) -> None:
    spec = json.loads(tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    specials = set(DEMO_SPECIAL_TOKENS)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([TokenType.CONTROL if t in specials else TokenType.NORMAL for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab["<|bos|>"])
    writer.add_eos_token_id(vocab["<|eos|>"])
    writer.add_add_bos_token(add_bos_token)
    writer.add_chat_template(DEMO_CHAT_TEMPLATE)


def _gguf_name(hf_name: str) -> str | None:
    if hf_name in _GLOBAL:
        return _GLOBAL[hf_name]
    parts = hf_name.split(".")
    if parts[:2] != ["model", "layers"]:
        return None
    layer, rest = parts[2], ".".join(parts[3:-1])
    return f"blk.{layer}.{_LAYER_PARTS[rest]}.{parts[-1]}"


def _permute(values: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's converter permutation of Q/K rows (the inverse of what loaders undo)."""
    grouped = values.reshape(num_heads, 2, values.shape[0] // num_heads // 2, *values.shape[1:])
    return np.ascontiguousarray(grouped.swapaxes(1, 2).reshape(values.shape))
