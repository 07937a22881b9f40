"""The packaged real tokenizer, where its package is installed."""

from __future__ import annotations

import functools

from radix.model_source import load_tokenizer, packaged_model_path
from radix.tokenizer import PromptTokenizer

SMOLLM2 = "SmolLM2-135M-Instruct"


@functools.cache
def packaged_smollm2() -> PromptTokenizer | None:
    """SmolLM2's tokenizer from its packaged GGUF, or None without the package. Read
    once per process: four test modules ask for it as they are collected, and reading
    the GGUF takes seconds."""
    try:
        packaged_model_path(SMOLLM2)
    except ValueError:
        return None
    return load_tokenizer(SMOLLM2)
