"""A ``PromptTokenizer`` built from a GGUF file's metadata.

A GGUF carries no tokenizer.json: llama.cpp stores the vocabulary, merges, token
types, special ids and chat template as metadata (``tokenizer.ggml.*``,
``tokenizer.chat_template``). For byte-level BPE vocabularies (``tokenizer.ggml.model
= "gpt2"``) this module builds the ``tokenizers`` object transformers builds from the
same file: BPE over the byte alphabet with GPT-2's byte-level pre-tokenizer and
decoder, control tokens (type 3) as special added tokens, user-defined ones (type 4)
as plain added tokens, BOS/EOS added by a template post-processor when the file's
``add_bos_token``/``add_eos_token`` say so, and the split regex that the file's
pre-tokenizer name (``tokenizer.ggml.pre``) stands for. Its serialized JSON is the
tokenizer's identity (``PromptTokenizer.digest``), so router and worker agree as they
do for a HF directory.

Reads metadata only (``radix.gguf_metadata``, no numpy, no torch): the router imports
this.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from radix.gguf_metadata import read_metadata
from radix.tokenizer import PromptTokenizer, byte_alphabet

T = TypeVar("T")
_CONTROL = 3
_USER_DEFINED = 4

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# tokenizer.ggml.pre -> split regex applied before the byte-level step; any other name
# uses GPT-2's own regex inside ByteLevel (as transformers does).
SPLIT_REGEXES = {
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "dbrx": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}


def read_gguf(path: str | Path, build: Callable[[Mapping[str, Any]], T]) -> T:
    """``build(metadata)`` over the GGUF file at ``path`` (``radix.gguf_metadata``); any
    ValueError (an unreadable file, or what ``build`` refuses) is re-raised with the
    path in front."""
    try:
        metadata = read_metadata(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable GGUF file: {exc}") from exc
    try:
        return build(metadata)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc


def load_gguf_tokenizer(path: str | Path) -> PromptTokenizer:
    """The tokenizer of the GGUF file at ``path``; ValueError naming the file when it
    is not a GGUF or describes a tokenizer other than byte-level BPE."""
    return read_gguf(path, gguf_tokenizer)


def gguf_tokenizer(metadata: Mapping[str, Any]) -> PromptTokenizer:
    """The tokenizer described by a GGUF's metadata (see the module docstring)."""
    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(
            f"tokenizer.ggml.model {kind!r} is not supported (only 'gpt2', byte-level BPE)"
        )
    tokens: list[str] = metadata.get("tokenizer.ggml.tokens") or []
    if not tokens:
        raise ValueError("tokenizer.ggml.tokens: missing or empty")
    token_types: list[int] = metadata.get("tokenizer.ggml.token_type") or []
    merges: list[str] = metadata.get("tokenizer.ggml.merges") or []
    tokenizer = _byte_level_bpe(tokens, merges, metadata.get("tokenizer.ggml.pre"))
    _add_typed_tokens(tokenizer, tokens, token_types)
    bos = _special(metadata, tokens, "bos_token_id")
    eos = _special(metadata, tokens, "eos_token_id")
    add_bos = bos is not None and bool(metadata.get("tokenizer.ggml.add_bos_token", False))
    add_eos = eos is not None and bool(metadata.get("tokenizer.ggml.add_eos_token", False))
    tokenizer.post_processor = _post_processor(
        tokenizer, bos if add_bos else None, eos if add_eos else None
    )
    extra_eos = [
        token_id
        for key in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
        if (token_id := metadata.get(key)) is not None
    ]
    return PromptTokenizer(
        tokenizer.to_str(),
        metadata.get("tokenizer.chat_template"),
        bos,
        eos,
        extra_eos,
    )


def _byte_level_bpe(tokens: list[str], merges: list[str], pre: str | None) -> Tokenizer:
    """BPE whose vocabulary is spelled in the byte alphabet (a token written with other
    characters is respelled from its UTF-8 bytes, as transformers does)."""
    spelling = byte_alphabet()
    alphabet = set(spelling)
    vocab = {
        token if set(token) <= alphabet else "".join(spelling[b] for b in token.encode()): index
        for index, token in enumerate(tokens)
    }
    pairs = []
    for merge in merges:
        parts = merge.split(" ")
        if len(parts) != 2:
            raise ValueError(f"tokenizer.ggml.merges: {merge!r} is not two tokens")
        pairs.append((parts[0], parts[1]))
    tokenizer = Tokenizer(
        models.BPE(vocab=vocab, merges=pairs, continuing_subword_prefix="",
                   end_of_word_suffix="", fuse_unk=False)
    )
    split = SPLIT_REGEXES.get(pre or "")
    if split is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _add_typed_tokens(tokenizer: Tokenizer, tokens: list[str], token_types: list[int]) -> None:
    """Control tokens become special added tokens (skipped when spelled outside the byte
    alphabet: a llama.cpp mislabel that would grow the vocabulary); user-defined ones
    become plain added tokens, so each stays whole in text."""
    alphabet = set(byte_alphabet())
    control = [
        AddedToken(token, normalized=False, special=True)
        for token, kind in zip(tokens, token_types, strict=False)
        if kind == _CONTROL and set(token) <= alphabet
    ]
    if control:
        tokenizer.add_special_tokens(control)
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    user_defined = [
        AddedToken(token, normalized=False, special=False)
        for token, kind in zip(tokens, token_types, strict=False)
        if kind == _USER_DEFINED and token in vocab
    ]
    if user_defined:
        tokenizer.add_tokens(user_defined)


def _special(metadata: Mapping[str, Any], tokens: list[str], name: str) -> str | None:
    token_id = metadata.get(f"tokenizer.ggml.{name}")
    if token_id is None:
        return None
    if not 0 <= token_id < len(tokens):
        raise ValueError(f"tokenizer.ggml.{name}: {token_id} is outside the vocabulary")
    return tokens[token_id]


def _post_processor(tokenizer: Tokenizer, bos: str | None, eos: str | None) -> Any:
    """Template post-processing that adds ``bos``/``eos`` (each may be None)."""
    single = " ".join([*([f"{bos}:0"] if bos else []), "$A:0", *([f"{eos}:0"] if eos else [])])
    pair = " ".join(
        [single, *([f"{bos}:1"] if bos else []), "$B:1", *([f"{eos}:1"] if eos else [])]
    )
    specials = [(token, tokenizer.token_to_id(token)) for token in (bos, eos) if token]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)
