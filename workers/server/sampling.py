"""This worker's request limits and the final check that turns a prompt plus validated
sampling (``radix.openai.sampling``: the bounds the router shares) into an engine
``GenerationRequest``.

``max_tokens`` must leave the prompt plus output within the context length (else
400); when absent it is ``default_max_tokens`` cut to what the context leaves. A
prompt with no room for one output token is a 413. For a resumed request the
prompt is the original one (without the resumed output) and ``max_tokens`` counts
the resumed tokens too. Unset sampling fields take the
engine's neutral values (temperature 1, top_p 1, no top_k); ``top_k`` -1 and 0 mean
off.
"""

from __future__ import annotations

from dataclasses import dataclass

from radix.api_errors import bad_request
from radix.openai.sampling import Sampling, SamplingBounds
from radix.tree import DIRECT
from workers.engine.request import GenerationParams, GenerationRequest
from workers.model.sampler import SamplingParams
from workers.server.errors import context_too_long


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask of this worker."""

    max_model_len: int
    vocab_size: int
    block_size: int
    max_n: int
    default_max_tokens: int

    @property
    def bounds(self) -> SamplingBounds:
        """The shared sampling bounds for this worker's vocabulary and ``max_n``."""
        return SamplingBounds(self.vocab_size, self.max_n)


def generation_request(
    prompt_token_ids: tuple[int, ...],
    sampling: Sampling,
    limits: RequestLimits,
    prompt_param: str,
    scope: str = DIRECT,
    num_public_tokens: int = 0,
    num_resumed_tokens: int = 0,
    max_cached_tokens: int | None = None,
    prompt_key: bytes | None = None,
    adapter: str | None = None,
    request_id: str | None = None,
    priority: int = 0,
) -> GenerationRequest:
    """The engine request; 413 when the prompt leaves no room, 400 when ``max_tokens``
    does not fit the context or is already used up by ``num_resumed_tokens``.
    ``prompt_key`` is the prompt's radix key when the request carried it; ``adapter``
    the LoRA adapter to run (None: the base model); ``request_id`` the caller's id;
    ``priority`` the scheduling priority (lower runs first)."""
    max_tokens = _max_tokens(sampling, limits, len(prompt_token_ids) - num_resumed_tokens,
                             num_resumed_tokens, prompt_param)
    params = SamplingParams(
        temperature=1.0 if sampling.temperature is None else sampling.temperature,
        top_p=1.0 if sampling.top_p is None else sampling.top_p,
        top_k=None if sampling.top_k in (None, -1, 0) else sampling.top_k,
        seed=sampling.seed,
        max_tokens=max_tokens,
        stop_token_ids=sampling.stop_token_ids,
        ignore_eos=bool(sampling.ignore_eos),
    )
    return GenerationRequest(
        prompt_token_ids,
        GenerationParams(params, sampling.n, sampling.stop),
        scope=scope,
        num_public_tokens=num_public_tokens,
        num_resumed_tokens=num_resumed_tokens,
        max_cached_tokens=max_cached_tokens,
        prompt_key=prompt_key,
        adapter=adapter,
        request_id=request_id,
        priority=priority,
    )


def _max_tokens(sampling: Sampling, limits: RequestLimits, num_prompt_tokens: int,
                num_resumed_tokens: int, prompt_param: str) -> int:
    """The request's ``max_tokens``, defaulted and checked (``generation_request``'s
    413 and 400s)."""
    room = limits.max_model_len - num_prompt_tokens
    if room < 1:
        raise context_too_long(prompt_param, num_prompt_tokens, limits.max_model_len)
    max_tokens = sampling.max_tokens
    if max_tokens is None:
        max_tokens = min(limits.default_max_tokens, room)
    elif max_tokens > room:
        raise bad_request(
            f"{sampling.max_tokens_param} is {max_tokens}, but the context length is "
            f"{limits.max_model_len} and the prompt has {num_prompt_tokens} tokens "
            f"(at most {room} output tokens)",
            sampling.max_tokens_param,
        )
    if num_resumed_tokens >= max_tokens:
        raise bad_request(f"num_resumed_tokens ({num_resumed_tokens}) must be below the "
                          f"completion's max_tokens ({max_tokens})", "num_resumed_tokens")
    return max_tokens
