"""The router's front: request bytes -> the model it names and the validated request.

The model is looked up first (400 when missing, 404 when unknown): a configured model,
or a LoRA adapter a worker registered (the request then runs on the model it adapts),
then the body is
validated by the shared OpenAI layer (``radix.openai``) with the bounds of that
model's vocabulary; a client-sent ``cache_salt`` is refused (the router sets it per
tenant). ``check_text_size`` refuses, before any tokenization, a prompt whose text
cannot fit the tenant's limit.
"""

from __future__ import annotations

from collections.abc import Mapping

from radix.api_errors import ApiError, bad_request
from radix.openai.json_body import decode_json_object
from radix.openai.requests import OpenAIRequest, parse_openai_request, requested_model
from router.config import TenantLimits
from router.models import Models, ModelTokenizer


def parse_request(raw: bytes, endpoint: str, models: Models, limits: TenantLimits,
                  adapters: Mapping[str, str]) -> tuple[ModelTokenizer, str | None, OpenAIRequest]:
    """The model, the LoRA adapter (None for the model itself; ``adapters`` maps each
    known adapter to its model) and the validated request; ApiError 400 (malformed,
    naming the field), 404 (unknown model or adapter) or 413 (a prompt of more token
    ids than ``limits`` allow, refused before the ids are converted)."""
    body = decode_json_object(raw)
    name = requested_model(body)
    if name is None:
        raise bad_request("model is required", "model")
    adapter = name if isinstance(name, str) and name not in models and name in adapters else None
    model = models.get(name if adapter is None else adapters[adapter])
    return model, adapter, parse_openai_request(body, endpoint, model.bounds,
                                                max_prompt_token_ids=limits.max_prompt_tokens,
                                                allow_priority=True)


def check_text_size(model: ModelTokenizer, parsed: OpenAIRequest, limits: TenantLimits) -> None:
    """413 (``prompt_too_long``) when the prompt's text has more characters than
    ``limits`` allow for ``model`` (see ``ModelTokenizer.max_prompt_chars``)."""
    max_chars = model.max_prompt_chars(limits)
    num_chars = parsed.num_text_chars()
    if max_chars is not None and num_chars > max_chars:
        raise ApiError(413, f"the prompt has {num_chars} characters of text; this key allows "
                       f"at most {max_chars} before tokenizing", param=parsed.prompt_param,
                       code="prompt_too_long")
