"""Validation of ``/v1/completions`` and ``/v1/chat/completions`` bodies.

Accepted prompts (completions): a string, a list of token ids, or a list holding
exactly one string or one list of token ids. Batches of several prompts are
refused (400): send one request per prompt. Chat messages take ``content`` as a
string, null, or a list of ``{"type": "text", "text": ...}`` parts, rendered with
the model's chat template (generation prompt appended).

Unknown fields are ignored, as OpenAI does. Features the worker does not implement
are refused with a 400 naming the field rather than silently ignored: ``logprobs``,
``echo``, ``suffix``, ``best_of`` other than ``n``, ``logit_bias``, non-zero
``presence_penalty``/``frequency_penalty``, ``tools``/``functions``, and a
``response_format`` other than text. ``model``, when given, must be the served
model name (404 otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass

from radix.tokenizer import PromptTokenizer
from workers.engine.request import GenerationRequest
from workers.server.errors import ApiError, bad_request
from workers.server.fields import Fields, token_id_list
from workers.server.sampling import (
    RequestLimits,
    SamplingInput,
    generation_request,
    parse_sampling,
)

MAX_MESSAGES = 4096
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class OpenAIRequest:
    """A validated OpenAI-shaped request."""

    request: GenerationRequest
    model: str
    stream: bool
    include_usage: bool


def parse_completion(
    fields: Fields, tokenizer: PromptTokenizer, limits: RequestLimits, model: str
) -> OpenAIRequest:
    """Validate a completions body (see the module docstring)."""
    model = _model(fields, model)
    _refuse_unsupported(fields, ("logprobs", "echo", "suffix"))
    prompt_ids = _prompt(fields.raw("prompt"), tokenizer, limits.vocab_size)
    sampling = parse_sampling(fields, limits)
    return _finish(fields, prompt_ids, sampling, limits, model, "prompt")


def parse_chat(
    fields: Fields, tokenizer: PromptTokenizer, limits: RequestLimits, model: str
) -> OpenAIRequest:
    """Validate a chat completions body (see the module docstring)."""
    model = _model(fields, model)
    _refuse_unsupported(fields, ("logprobs", "top_logprobs", "tools", "functions"))
    response_format = fields.object("response_format")
    if response_format.raw("type") not in (None, "text"):
        raise bad_request("only the text response_format is supported", "response_format")
    messages = _messages(fields.raw("messages"))
    try:
        prompt_ids = tuple(tokenizer.encode_chat(messages))
    except ValueError as exc:
        raise bad_request(f"messages could not be rendered: {exc}", "messages") from exc
    sampling = parse_sampling(fields, limits, ("max_completion_tokens", "max_tokens"))
    return _finish(fields, prompt_ids, sampling, limits, model, "messages")


def _finish(
    fields: Fields,
    prompt_ids: tuple[int, ...],
    sampling: SamplingInput,
    limits: RequestLimits,
    model: str,
    prompt_param: str,
) -> OpenAIRequest:
    best_of = fields.integer("best_of", None)
    if best_of is not None and best_of != sampling.n:
        raise bad_request("best_of is not supported (it must equal n)", "best_of")
    for name in ("presence_penalty", "frequency_penalty"):
        if fields.number(name, 0.0, -2.0, 2.0) != 0.0:
            raise bad_request(f"{name} is not supported (it must be 0)", name)
    stream = fields.boolean("stream", False)
    include_usage = fields.object("stream_options").boolean("include_usage", False)
    request = generation_request(prompt_ids, sampling, limits, prompt_param)
    return OpenAIRequest(request, model, stream, include_usage)


def _model(fields: Fields, served: str) -> str:
    model = fields.raw("model")
    if model is None:
        return served
    if not isinstance(model, str):
        raise bad_request("model must be a string", "model")
    if model != served:
        raise ApiError(404, f"the model {model!r} does not exist; this worker serves {served!r}",
                       param="model", code="model_not_found")  # fmt: skip
    return model


def _refuse_unsupported(fields: Fields, names: tuple[str, ...]) -> None:
    for name in (*names, "logit_bias"):
        value = fields.raw(name)
        if value not in (None, False, {}, []):
            raise bad_request(f"{name} is not supported by this worker", name)


def _prompt(value: object, tokenizer: PromptTokenizer, vocab_size: int) -> tuple[int, ...]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        token_ids = tuple(tokenizer.encode(value))
        if not token_ids:
            raise bad_request("prompt encodes to no tokens", "prompt")
        return token_ids
    if isinstance(value, list) and value and all(type(t) is int for t in value):
        return token_id_list(value, "prompt", vocab_size)
    raise bad_request(
        "prompt must be a string, a list of token ids, or a list with exactly one of those",
        "prompt",
    )


def _messages(value: object) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value or len(value) > MAX_MESSAGES:
        raise bad_request(f"messages must be a list of 1 to {MAX_MESSAGES} messages", "messages")
    messages = []
    for i, item in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object", where)
        role = item.get("role")
        if role not in CHAT_ROLES:
            raise bad_request(f"{where}.role must be one of {CHAT_ROLES}", f"{where}.role")
        messages.append({"role": role, "content": _content(item.get("content"), f"{where}.content")})
    return messages


def _content(value: object, where: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        for part in value
    ):
        return "".join(part["text"] for part in value)
    raise bad_request(f"{where} must be a string or a list of text parts", where)
