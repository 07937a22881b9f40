"""A validated request's prompt as token ids: one rule for the router and the worker.

Chat messages are rendered with the tokenizer's template, special-token strings in
their content kept as text (``PromptTokenizer.encode_chat``); a text prompt is
encoded as the client wrote it (BOS added, special tokens honoured: the client owns
the whole prompt); token ids pass as given (the parser checked them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from radix.api_errors import bad_request
from radix.openai.requests import OpenAIRequest
from radix.token_cache import TextEncoder


def encode_messages(tokenizer: TextEncoder, messages: Sequence[Mapping[str, Any]],
                    add_generation_prompt: bool = True) -> list[int]:
    """Token ids of the rendered chat; 400 naming ``messages`` when the template
    refuses them (``raise_exception``, an unknown role)."""
    try:
        return tokenizer.encode_chat(messages, add_generation_prompt)
    except ValueError as exc:
        raise bad_request(f"messages could not be rendered: {exc}", "messages") from exc


def prompt_token_ids(request: OpenAIRequest, tokenizer: TextEncoder) -> list[int]:
    """The prompt of ``request`` as token ids (see the module docstring)."""
    if request.messages is not None:
        return encode_messages(tokenizer, request.messages)
    if isinstance(request.prompt, str):
        return tokenizer.encode(request.prompt)
    assert request.prompt is not None
    return list(request.prompt)
