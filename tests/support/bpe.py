"""Small byte-level BPE tokenizers trained in memory, for tests that need real merges."""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from radix.tokenizer import DEMO_SPECIAL_TOKENS, PromptTokenizer


def merging_bpe(corpus: Iterable[str], chat_template: str | None = None) -> PromptTokenizer:
    """A 400-token byte-level BPE with GPT-2's regex pre-tokenizer and the demo special
    tokens, trained on ``corpus``; every byte string stays encodable."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(DEMO_SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(list(corpus), trainer)
    return PromptTokenizer(bpe.to_str(), chat_template, "<|bos|>", "<|eos|>")
