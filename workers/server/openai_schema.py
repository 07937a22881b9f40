"""The worker's side of the shared OpenAI layer (``radix.openai.requests``): which
requests this worker takes and the engine request they become (their prompts
become token ids by ``radix.openai.prompt``, as on the router).

``model``, when given, must be one of the served model names or a registered LoRA
adapter (which the request then runs; 404 ``model_not_found`` listing them
otherwise); absent, it is the first served name. The worker's direct routes serve trusted callers in scope
``direct`` (``radix.tree.DIRECT``: never the scope of a router's clients, keyless
ones included, so cache timing does not cross between them); a ``cache_salt`` moves a request into scope ``salt:<cache_salt>``,
so requests with different salts never share prefix-cache blocks (vLLM's rule),
which is what lets a router put this worker behind it as ``kind = "openai"``. Their
``priority`` (vLLM's) orders the engine's admission and preemption. A
prompt whose text has more characters than the context could hold as tokens is a
413 before it is tokenized.
"""

from __future__ import annotations

from typing import Any

from radix.api_errors import ApiError
from radix.openai.requests import OpenAIRequest, parse_openai_request, requested_model
from radix.openai.sampling import SamplingBounds
from radix.tokenizer import PromptTokenizer
from radix.tree import DIRECT
from workers.engine.request import GenerationRequest
from workers.server.sampling import RequestLimits, generation_request

DIRECT_SCOPE = DIRECT
SALT_SCOPE_PREFIX = "salt:"


def parse(body: dict[str, Any], endpoint: str, limits: RequestLimits,
          served_models: tuple[str, ...], tokenizer: PromptTokenizer,
          adapters: tuple[str, ...] = ()) -> OpenAIRequest:
    """The validated request; 404 for another model, 400 naming a bad field, 413 for
    a prompt text too long for the context. Token ids are bounded by the tokenizer's
    vocabulary, as on the router (``/generate`` allows the model's padded one: a
    resumed request carries generated ids)."""
    model = requested_model(body)
    if model is not None and model not in served_models and model not in adapters:
        served = ", ".join(repr(name) for name in (*served_models, *adapters))
        raise ApiError(404, f"the model {model!r} does not exist; this worker serves {served}",
                       param="model", code="model_not_found")
    bounds = SamplingBounds(min(limits.vocab_size, tokenizer.vocab_size), limits.max_n)
    request = parse_openai_request(body, endpoint, bounds, allow_cache_salt=True,
                                   allow_priority=True)
    max_chars = limits.max_model_len * tokenizer.max_chars_per_token
    if request.num_text_chars() > max_chars:
        raise ApiError(413, f"the prompt has {request.num_text_chars()} characters of text, "
                       f"more than this model's context of {limits.max_model_len} tokens "
                       "can hold", param=request.prompt_param, code="context_length_exceeded")
    return request


def engine_request(request: OpenAIRequest, token_ids: tuple[int, ...],
                   limits: RequestLimits, served_models: tuple[str, ...] = ()) -> GenerationRequest:
    """The engine request, in the scope the request's ``cache_salt`` selects, running
    the adapter its ``model`` names (a name not served as the base model's), at its
    ``priority``."""
    scope = DIRECT_SCOPE if request.cache_salt is None else SALT_SCOPE_PREFIX + request.cache_salt
    adapter = None if request.model is None or request.model in served_models else request.model
    return generation_request(token_ids, request.sampling, limits, request.prompt_param,
                              scope=scope, adapter=adapter, priority=request.priority)
