"""The configured models: name -> tokenizer, prompt rendering, public prefixes.

The router renders chat templates and tokenizes every prompt itself with the model's
``PromptTokenizer`` (the same files the workers load, checked by digest), so limits
and routing never rest on lengths a client declared; the prompt rule is the one the
workers use (``radix.openai.prompt``: chat content special-token strings stay text).
Each model also keeps the operator-registered public prefixes; a request's ``num_public_tokens`` is the longest
registered prefix its tokens start with, rounded down to a whole number of blocks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radix.api_errors import ApiError
from radix.keys import to_key
from radix.model_source import load_tokenizer
from radix.openai.fields import token_id_list
from radix.openai.prompt import encode_messages, prompt_token_ids
from radix.openai.requests import OpenAIRequest
from radix.openai.sampling import SamplingBounds
from radix.token_cache import CacheStats, token_cache
from radix.tokenizer import PromptTokenizer
from radix.tree import PUBLIC, RadixTree, Scope
from router.config import MAX_BODY_BYTES, ModelSpec, PublicPrefixSpec, TenantLimits

BODY_OVERHEAD_BYTES = 64 * 1024
_TOKEN_ID_BYTES = len("4294967295,")
_TEXT_CHAR_BYTES = len("\\uXXXX")


@dataclass(frozen=True)
class Prompt:
    """A tokenized request prompt: ids, their tree key, and how many leading tokens
    (a multiple of the block size) are public."""

    token_ids: list[int]
    key: bytes
    num_public_tokens: int


def _keep_end_mark(payload: bool | None, num_head_tokens: int) -> tuple[None, bool | None]:
    """A split head ends inside the edge, so it is never a registered prefix end."""
    return None, payload


class PublicPrefixes:
    """Registered public prefixes of one model, as a radix tree whose nodes are marked
    (payload True) where a registered prefix ends. Lookup is one walk of the path."""

    def __init__(self, block_size: int) -> None:
        self._block_size = block_size
        self._tree: RadixTree[bool | None] = RadixTree(_keep_end_mark)
        self.num_prefixes = 0

    def add(self, token_ids: Sequence[int]) -> int:
        """Register a prefix; returns how many of its tokens can be public (whole blocks)."""
        result = self._tree.insert(to_key(token_ids), PUBLIC)
        if not result.nodes[-1].payload:
            result.nodes[-1].payload = True
            self.num_prefixes += 1
        return len(token_ids) // self._block_size * self._block_size

    def registered(self) -> list[bytes]:
        """Every registered prefix, as a key (``radix.keys.to_key``)."""
        return [self._tree.path_key(node) for node in self._tree.iter_nodes() if node.payload]

    def num_public_tokens(self, key: bytes) -> int:
        """Longest registered prefix that ``key`` starts with, rounded down to blocks."""
        match = self._tree.match(key, PUBLIC, touch=False)
        longest = 0
        for node in match.nodes:
            if node.end > match.num_matched_tokens:
                break
            if node.payload:
                longest = node.end
        return longest // self._block_size * self._block_size


class ModelTokenizer:
    """One served model: its tokenizer, block size, public prefixes and what its workers
    must report (``expect``)."""

    def __init__(self, config: ModelSpec, tokenizer: PromptTokenizer) -> None:
        self.name = config.name
        self.block_size = config.block_size
        self.expect = config.expect
        self.max_model_len = config.max_model_len
        self.tokenizer = tokenizer
        self.token_cache = token_cache(tokenizer, config.token_cache_chars)
        self.public_prefixes = PublicPrefixes(config.block_size)
        for spec in config.public_prefixes:
            self.public_prefixes.add(self.prefix_tokens(spec))

    @property
    def bounds(self) -> SamplingBounds:
        """The sampling bounds of requests for this model (its vocabulary)."""
        return SamplingBounds(self.tokenizer.vocab_size)

    @property
    def digest(self) -> str:
        """The tokenizer digest workers must report in ``/ready`` to serve this model."""
        return self.tokenizer.digest

    def prefix_tokens(self, spec: PublicPrefixSpec) -> list[int]:
        """Token ids of a public prefix: text like a completions prompt, messages like a
        chat prompt without the generation prompt. Its text enters the token cache as
        ``PUBLIC``, so every tenant's prompts reuse it."""
        if spec.token_ids is not None:
            vocab_size = self.tokenizer.vocab_size
            return list(token_id_list(list(spec.token_ids), "token_ids", vocab_size))
        encoder = self.token_cache.scoped(PUBLIC)
        if spec.messages is not None:
            return encode_messages(encoder, spec.messages, add_generation_prompt=False)
        return encoder.encode(spec.text or "")

    def max_prompt_chars(self, limits: TenantLimits) -> int | None:
        """The most text characters a prompt may have under ``limits`` before it is
        tokenized: ``max_prompt_chars`` when set, else ``max_prompt_tokens`` times the
        tokenizer's longest token (a prompt over it cannot fit), else no bound."""
        if limits.max_prompt_chars is not None:
            return limits.max_prompt_chars
        if limits.max_prompt_tokens is None:
            return None
        return limits.max_prompt_tokens * self.tokenizer.max_chars_per_token

    def prompt(self, request: OpenAIRequest, tenant_id: str) -> Prompt:
        """The router's own token ids for a validated request
        (``radix.openai.prompt.prompt_token_ids``, through the token cache in the
        tenant's scope) with their key and public part."""
        token_ids = prompt_token_ids(request, self.token_cache.scoped(Scope(tenant_id)))
        key = to_key(token_ids)
        return Prompt(token_ids, key, self.public_prefixes.num_public_tokens(key))


class Models:
    """The served models by name."""

    def __init__(self, models: Mapping[str, ModelTokenizer]) -> None:
        self._models = dict(models)

    @classmethod
    def from_config(cls, configs: Mapping[str, ModelSpec]) -> Models:
        """Load every model's tokenizer; ValueError naming ``models.<name>`` on failure."""
        models = {}
        for name, config in configs.items():
            try:
                models[name] = ModelTokenizer(config, load_tokenizer(config.tokenizer))
            except (ValueError, ApiError) as exc:
                raise ValueError(f"models.{name}: {exc}") from exc
        return cls(models)

    def get(self, name: Any) -> ModelTokenizer:
        """The model called ``name``; ApiError 400 if not a string, 404 if unknown."""
        if not isinstance(name, str):
            raise ApiError(400, "model must be a string", param="model")
        model = self._models.get(name)
        if model is None:
            raise ApiError(404, f"model {name!r} does not exist", param="model",
                           code="model_not_found")
        return model

    def __contains__(self, name: object) -> bool:
        """Whether a model is called ``name``."""
        return name in self._models

    def max_body_bytes(self, limits: TenantLimits) -> int:
        """The largest request body a prompt within ``limits`` and within its model's
        context (``max_model_len``, known before the body that names the model is read)
        can need, for any model: ``BODY_OVERHEAD_BYTES`` for the other fields, plus its
        token ids at their widest (``4294967295,``) or its text at its widest (the
        tenant's ``max_prompt_chars``, else the longest token per token, a character
        escaped as ``\\uXXXX``); at most ``MAX_BODY_BYTES``. A tenant without limits
        is bounded by the context all the same."""
        widest = 0
        for model in self._models.values():
            num_tokens = min(limits.max_prompt_tokens or model.max_model_len,
                             model.max_model_len)
            num_chars = num_tokens * model.tokenizer.max_chars_per_token
            if limits.max_prompt_chars is not None:
                num_chars = min(num_chars, limits.max_prompt_chars)
            widest = max(widest, _TOKEN_ID_BYTES * num_tokens, _TEXT_CHAR_BYTES * num_chars)
        return min(MAX_BODY_BYTES, BODY_OVERHEAD_BYTES + widest)

    def token_cache_stats(self) -> dict[str, CacheStats]:
        """Each model's token cache totals."""
        return {name: model.token_cache.stats() for name, model in self._models.items()}

    def names(self) -> list[str]:
        """Model names in config order."""
        return list(self._models)
