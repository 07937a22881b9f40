"""``/v1/completions`` and ``/v1/chat/completions`` bodies -> ``OpenAIRequest``.

The same parser runs on the router and on the worker's OpenAI routes, so both answer
one body with the same status and the same ``param``. Fields fall in four groups:

- accepted: ``model``, ``stream``, ``stream_options.include_usage``, ``user``
  (checked, used for nothing), ``max_tokens`` (chat also ``max_completion_tokens``,
  which wins), the sampling fields of ``radix.openai.sampling``, and the prompt:
  completions ``prompt`` is a non-empty string, a list of token ids, or a list
  holding exactly one of those (batches are refused: one request per prompt); chat
  ``messages`` are 1 to 4096 objects with exactly ``role`` (system, developer, user,
  assistant, tool) and ``content`` (a string, null, or ``{"type": "text", "text"}``
  parts). Nothing else may ride along in a message: what reaches the chat template
  is what the router renders and counts.
- known but not implemented, refused when set to anything but their neutral value:
  ``logprobs``, ``top_logprobs``, ``echo``, ``suffix``, ``best_of`` other than
  ``n``, ``logit_bias``, non-zero ``presence_penalty``/``frequency_penalty``,
  ``tools``/``functions``/``tool_choice``/``function_call``/``parallel_tool_calls``,
  and a ``response_format`` other than text.
- server-owned: ``cache_salt`` (the router derives it per tenant); only a worker's
  own direct routes accept it from their (trusted) caller. ``priority`` (vLLM's:
  an integer in [``MIN_PRIORITY``, ``MAX_PRIORITY``], default 0, lower is scheduled
  earlier) only where the caller allows it (a worker's own routes; a router whose
  flow control bounds it by the tenant's band).
- anything else: refused as an unknown field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radix.api_errors import ApiError, bad_request
from radix.openai.fields import Fields, describe, token_id_list
from radix.openai.sampling import (
    SAMPLING_FIELDS,
    Sampling,
    SamplingBounds,
    parse_sampling,
)

COMPLETIONS = "completions"
CHAT = "chat"
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
_MESSAGE_FIELDS = frozenset(("role", "content"))
MAX_MESSAGES = 4096
MAX_NAME_CHARS = 256
_UPSTREAM_PROMPT_PARAMS = ("token_ids_b64", "token_ids", "prompt")
INLINE_TOKENIZE_CHARS = 8192  # longer prompt texts are tokenized off the event loop
INLINE_CHARS_PER_MESSAGE = 64  # what rendering one chat message counts toward that bound
MAX_PROMPT_TOKEN_IDS = 1 << 20  # a prompt given as token ids, when no tighter bound is set
MIN_PRIORITY, MAX_PRIORITY = -(2**31), 2**31 - 1  # a signed 32-bit integer
_COMMON = ("model", "stream", "stream_options", "user", "max_tokens", *SAMPLING_FIELDS,
           "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "cache_salt",
           "priority")
_FIELDS = {
    COMPLETIONS: frozenset((*_COMMON, "prompt", "echo", "suffix", "best_of")),
    CHAT: frozenset((*_COMMON, "messages", "max_completion_tokens", "top_logprobs", "tools",
                     "functions", "tool_choice", "function_call", "parallel_tool_calls",
                     "response_format")),
}


@dataclass(frozen=True)
class OpenAIRequest:
    """A validated request. Exactly one of ``prompt`` (completions: text or token ids)
    and ``messages`` (chat: ``{"role", "content"}`` strings) is set. ``model`` is None
    when the client sent none; ``cache_salt`` only ever comes from a trusted caller.
    ``priority`` is the scheduling priority (lower runs first, 0 when not given): a
    server may replace it (``dataclasses.replace``) before the request goes on; it
    travels to our workers in ``GenerateRequest.priority`` and never to an OpenAI
    upstream (``upstream_body``: vLLM refuses a non-zero one unless it schedules by
    priority)."""

    endpoint: str
    model: str | None
    sampling: Sampling
    stream: bool
    include_usage: bool
    prompt: str | tuple[int, ...] | None = None
    messages: tuple[dict[str, str], ...] | None = None
    cache_salt: str | None = None
    priority: int = 0

    @property
    def prompt_param(self) -> str:
        """The field that carries the prompt (``prompt`` or ``messages``)."""
        return "messages" if self.endpoint == CHAT else "prompt"

    def client_param(self, param: str | None) -> str | None:
        """The name this request's client used for a field an upstream named in an
        error: ``/generate`` calls the prompt ``token_ids_b64`` and the sampling fields
        ``sampling.<name>``, and every upstream gets ``max_completion_tokens`` as
        ``max_tokens``."""
        if param in _UPSTREAM_PROMPT_PARAMS:
            return self.prompt_param
        name = param.removeprefix("sampling.") if param is not None else None
        return self.sampling.max_tokens_param if name == "max_tokens" else name

    def num_text_chars(self) -> int:
        """Characters of text to tokenize (0 for a prompt given as token ids): every
        token covers at least one of them, so it bounds the token count from below
        once divided by the tokenizer's longest token."""
        if self.messages is not None:
            return sum(len(message["content"]) for message in self.messages)
        return len(self.prompt) if isinstance(self.prompt, str) else 0

    def tokenize_cost(self) -> int:
        """``num_text_chars`` plus ``INLINE_CHARS_PER_MESSAGE`` per chat message (the
        template renders each, even an empty one): compared with
        ``INLINE_TOKENIZE_CHARS`` to decide whether tokenizing may run on the loop."""
        return self.num_text_chars() + INLINE_CHARS_PER_MESSAGE * len(self.messages or ())

    def upstream_body(self, model: str, max_tokens: int | None,
                      prompt_token_ids: list[int], cache_salt: str) -> tuple[str, dict[str, Any]]:
        """Path and body for an OpenAI-compatible backend: always ``/v1/completions``
        with the router's own token ids as the prompt (for chat, the messages as the
        router rendered and counted them, content as text), only validated fields,
        usage always asked for when streaming, and the tenant's ``cache_salt``. The
        caller shapes a chat request's answer back into chat objects."""
        body: dict[str, Any] = {"model": model, **self.sampling.to_wire(max_tokens),
                                "stream": self.stream, "cache_salt": cache_salt,
                                "prompt": prompt_token_ids}
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        return "/v1/completions", body


def parse_openai_request(body: dict[str, Any], endpoint: str, bounds: SamplingBounds,
                         allow_cache_salt: bool = False,
                         max_prompt_token_ids: int | None = None,
                         allow_priority: bool = False) -> OpenAIRequest:
    """Validate ``body`` for ``endpoint`` (see the module docstring); ApiError 400
    naming the first bad field (``cache_salt`` and ``priority`` too unless allowed),
    413 (``prompt_too_long``) for a prompt of token ids longer than
    ``max_prompt_token_ids`` (default ``MAX_PROMPT_TOKEN_IDS``), checked before any id
    is converted."""
    fields = Fields(body)
    fields.only(_FIELDS[endpoint])
    if fields.has("cache_salt") and not allow_cache_salt:
        raise bad_request("cache_salt is set by the server, not by the client", "cache_salt")
    if fields.has("priority") and not allow_priority:
        raise bad_request("priority is not accepted on this server", "priority")
    model = requested_model(body)
    _refuse_unsupported(fields, endpoint)
    user = fields.raw("user")
    if user is not None and (not isinstance(user, str) or len(user) > MAX_NAME_CHARS):
        raise bad_request(f"user must be a string of at most {MAX_NAME_CHARS} characters", "user")
    if endpoint == CHAT:
        prompt, messages = None, _messages(fields.raw("messages"))
        max_tokens_names: tuple[str, ...] = ("max_completion_tokens", "max_tokens")
    else:
        max_ids = min(max_prompt_token_ids or MAX_PROMPT_TOKEN_IDS, MAX_PROMPT_TOKEN_IDS)
        prompt, messages = _prompt(fields.raw("prompt"), bounds.vocab_size, max_ids), None
        max_tokens_names = ("max_tokens",)
    sampling = parse_sampling(fields, bounds, max_tokens_names)
    best_of = fields.integer("best_of", None)
    if best_of is not None and best_of != sampling.n:
        raise bad_request("best_of is not supported (it must equal n)", "best_of")
    stream = fields.boolean("stream", False)
    options = fields.object("stream_options")
    options.only(("include_usage",))
    include_usage = options.boolean("include_usage", False)
    cache_salt = fields.string("cache_salt", None, MAX_NAME_CHARS)
    return OpenAIRequest(endpoint, model, sampling, stream, include_usage, prompt, messages,
                         cache_salt, parse_priority(fields))


def parse_priority(fields: Fields) -> int:
    """``priority`` of ``fields``: an integer in [``MIN_PRIORITY``, ``MAX_PRIORITY``],
    0 when absent; 400 naming the field otherwise (booleans and floats included)."""
    return fields.integer("priority", 0, lo=MIN_PRIORITY, hi=MAX_PRIORITY) or 0


def _refuse_unsupported(fields: Fields, endpoint: str) -> None:
    names = ("logprobs", "logit_bias")
    if endpoint == CHAT:
        names += ("top_logprobs", "tools", "functions", "tool_choice", "function_call",
                  "parallel_tool_calls")
        response_format = fields.object("response_format")
        response_format.only(("type",))
        if response_format.raw("type") not in (None, "text"):
            raise bad_request("only the text response_format is supported", "response_format")
    else:
        names += ("echo", "suffix")
    for name in names:
        value = fields.raw(name)
        unset = value is None or value is False or (isinstance(value, (dict, list)) and not value)
        if not unset and not (name == "tool_choice" and value == "none"):
            raise bad_request(f"{name} is not supported, got {describe(value)}", name)
    for name in ("presence_penalty", "frequency_penalty"):
        if fields.number(name, -2.0, 2.0) not in (None, 0.0):
            raise bad_request(f"{name} is not supported (it must be 0)", name)


def _prompt(value: object, vocab_size: int, max_token_ids: int) -> str | tuple[int, ...]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str) and value:
        return value
    if isinstance(value, list) and value and type(value[0]) is int:
        if len(value) > max_token_ids:
            raise ApiError(413, f"the prompt has {len(value)} token ids; at most "
                           f"{max_token_ids} are allowed", param="prompt",
                           code="prompt_too_long")
        return token_id_list(value, "prompt", vocab_size)
    if value is None:
        raise bad_request("prompt is required", "prompt")
    raise bad_request("prompt must be a non-empty string, a list of token ids, or a list "
                      "with exactly one of those (batched prompts are not supported)", "prompt")


def _messages(value: object) -> tuple[dict[str, str], ...]:
    """The messages; a plain one (``role`` and a string or null ``content``, nothing
    else) is taken in a few dictionary lookups, any other goes through ``_message``,
    which accepts the same plain ones and words every refusal."""
    if not isinstance(value, list) or not value or len(value) > MAX_MESSAGES:
        raise bad_request(f"messages must be a list of 1 to {MAX_MESSAGES} messages", "messages")
    messages = []
    for i, item in enumerate(value):
        if type(item) is dict and item.keys() <= _MESSAGE_FIELDS:
            role, content = item.get("role"), item.get("content")
            if type(role) is str and role in CHAT_ROLES and (
                    content is None or type(content) is str):
                messages.append({"role": role, "content": content or ""})
                continue
        messages.append(_message(item, i))
    return tuple(messages)


def _message(item: object, i: int) -> dict[str, str]:
    message = Fields(item, f"messages[{i}]")
    message.only(_MESSAGE_FIELDS)
    role = message.raw("role")
    if role not in CHAT_ROLES:
        param = message.param("role")
        raise bad_request(f"{param} must be one of {', '.join(CHAT_ROLES)}", param)
    return {"role": role, "content": _content(message.raw("content"), message.param("content"))}


def _content(value: object, param: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for i, item in enumerate(value):
            part = Fields(item, f"{param}[{i}]")
            part.only(("type", "text"))
            text = part.raw("text")
            if part.raw("type") != "text" or not isinstance(text, str):
                raise bad_request(f"{param}[{i}] must be a text part "
                                  '({"type": "text", "text": ...})', f"{param}[{i}]")
            texts.append(text)
        return "".join(texts)
    raise bad_request(f"{param} must be a string, null or a list of text parts", param)


def requested_model(body: dict[str, Any]) -> str | None:
    """The ``model`` a body names (None when absent), read before anything else so
    both sides answer an unknown model with 404 first; 400 when it is not a string."""
    return Fields(body).string("model", None, MAX_NAME_CHARS)
