"""Trusted tokenization: model name -> tokenizer, prompt rendering, public prefixes.

The router renders chat templates and tokenizes every prompt itself with the model's
``PromptTokenizer`` (the same files the workers load, checked by digest), so limits
and routing never rest on lengths a client declared. Each model also keeps the
operator-registered public prefixes; a request's ``num_public_tokens`` is the longest
registered prefix its tokens start with, rounded down to a whole number of blocks.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radix.keys import to_key
from radix.tokenizer import PromptTokenizer
from radix.tree import PUBLIC, RadixTree
from router.config import ModelConfig, PublicPrefixSpec
from router.errors import ApiError


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
    """One served model: its tokenizer, block size and public prefixes."""

    def __init__(self, config: ModelConfig, tokenizer: PromptTokenizer) -> None:
        self.name = config.name
        self.block_size = config.block_size
        self.tokenizer = tokenizer
        self.public_prefixes = PublicPrefixes(config.block_size)
        for spec in config.public_prefixes:
            self.public_prefixes.add(self.prefix_tokens(spec))

    @property
    def digest(self) -> str:
        """The tokenizer digest workers must report in ``/ready`` to serve this model."""
        return self.tokenizer.digest

    def prefix_tokens(self, spec: PublicPrefixSpec) -> list[int]:
        """Token ids of a public prefix: text like a completions prompt, messages like a
        chat prompt without the generation prompt."""
        if spec.token_ids is not None:
            return self._checked_ids(spec.token_ids, "token_ids")
        if spec.messages is not None:
            text = self._render(spec.messages, add_generation_prompt=False)
            return self.tokenizer.encode(text, add_special_tokens=False)
        return self.tokenizer.encode(spec.text or "")

    def completion_prompt(self, prompt: Any) -> Prompt:
        """Tokenize a completions ``prompt`` (a string or a list of token ids)."""
        if isinstance(prompt, str):
            if not prompt:
                raise ApiError(400, "prompt must not be empty", param="prompt")
            return self._prompt(self.tokenizer.encode(prompt))
        if isinstance(prompt, list) and prompt and type(prompt[0]) is int:
            return self._prompt(self._checked_ids(prompt, "prompt"))
        raise ApiError(400, "prompt must be a non-empty string or a list of token ids "
                       "(batched prompts are not supported)", param="prompt")

    def chat_prompt(self, messages: Any) -> Prompt:
        """Render and tokenize chat ``messages`` with a generation prompt."""
        text = self._render(_checked_messages(messages), add_generation_prompt=True)
        return self._prompt(self.tokenizer.encode(text, add_special_tokens=False))

    def _render(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt)
        except ValueError as exc:
            raise ApiError(400, str(exc), param="messages") from exc

    def _prompt(self, token_ids: list[int]) -> Prompt:
        key = to_key(token_ids)
        return Prompt(token_ids, key, self.public_prefixes.num_public_tokens(key))

    def _checked_ids(self, token_ids: Sequence[int], param: str) -> list[int]:
        """The ids as a list if all are integers in [0, vocab_size); checked at C speed
        (``array`` refuses non-integers and values outside [0, 2**32))."""
        vocab_size = self.tokenizer.vocab_size
        try:
            packed = array("I", token_ids)
        except (TypeError, OverflowError):
            packed = None
        if not packed or max(packed) >= vocab_size:
            raise ApiError(400, f"{param} must hold token ids in [0, {vocab_size})", param=param)
        return list(token_ids)


def _checked_messages(messages: Any) -> list[dict[str, str]]:
    """Chat messages as ``{"role", "content"}`` strings; content parts of type text are
    joined. ApiError 400 naming the bad message otherwise."""
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(400, f"{where} must be an object with a string role", param=where)
        content = message.get("content")
        if isinstance(content, list):
            parts = [p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None
                     for p in content]
            if not all(isinstance(p, str) for p in parts):
                raise ApiError(400, f"{where}.content parts must be text parts",
                               param=f"{where}.content")
            content = "".join(parts)
        if not isinstance(content, str):
            raise ApiError(400, f"{where}.content must be a string", param=f"{where}.content")
        out.append({"role": message["role"], "content": content})
    return out


def load_tokenizer(source: str) -> PromptTokenizer:
    """``"demo"`` -> the built-in byte-level tokenizer, else a local HF model directory."""
    return PromptTokenizer.demo() if source == "demo" else PromptTokenizer.from_dir(source)


class Models:
    """The served models by name."""

    def __init__(self, models: Mapping[str, ModelTokenizer]) -> None:
        self._models = dict(models)

    @classmethod
    def from_config(cls, configs: Mapping[str, ModelConfig]) -> Models:
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

    def names(self) -> list[str]:
        """Model names in config order."""
        return list(self._models)
