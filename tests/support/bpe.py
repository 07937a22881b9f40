"""Small byte-level BPE tokenizers trained in memory, for tests that need real merges."""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from radix.tokenizer import DEMO_SPECIAL_TOKENS, PromptTokenizer


def trained_bpe(corpus: Iterable[str], vocab_size: int = 400) -> Tokenizer:
    """A byte-level BPE with GPT-2's regex pre-tokenizer and the demo special tokens
    (ids 0..5), trained on ``corpus``; every byte string stays encodable."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(DEMO_SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(list(corpus), trainer)
    return bpe


def merging_bpe(corpus: Iterable[str], chat_template: str | None = None) -> PromptTokenizer:
    """``trained_bpe`` (400 tokens) as a ``PromptTokenizer`` with the demo BOS/EOS."""
    return PromptTokenizer(trained_bpe(corpus).to_str(), chat_template, "<|bos|>", "<|eos|>")
