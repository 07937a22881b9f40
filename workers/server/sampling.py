"""Sampling fields shared by ``/generate`` and the OpenAI routes, and the final check
that turns a prompt plus sampling into an engine ``GenerationRequest``.

Bounds: ``temperature`` in [0, 2], ``top_p`` in (0, 1], ``top_k`` -1/0 (off) or >= 1,
``seed`` in [0, 2**63), ``n`` in [1, max_n], at most 16 stop strings of at most 256
characters, at most 64 stop token ids. ``max_tokens`` must be >= 1 and leave the
prompt plus output within the context length (else 400); when absent it is
``default_max_tokens`` cut to what the context leaves. A prompt with no room for
one output token is a 413.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from workers.engine.request import GenerationParams, GenerationRequest
from workers.model.sampler import SamplingParams
from workers.server.errors import bad_request, context_too_long
from workers.server.fields import Fields, token_id_list

MAX_STOP_STRINGS = 16
MAX_STOP_LEN = 256
MAX_STOP_TOKEN_IDS = 64


@dataclass(frozen=True)
class RequestLimits:
    """What one request may ask of this worker."""

    max_model_len: int
    vocab_size: int
    block_size: int
    max_n: int
    default_max_tokens: int


@dataclass(frozen=True)
class SamplingInput:
    """Validated sampling fields; ``max_tokens`` None means the default."""

    max_tokens: int | None
    max_tokens_param: str
    temperature: float
    top_p: float
    top_k: int | None
    seed: int | None
    n: int
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool


def parse_sampling(
    fields: Fields, limits: RequestLimits, max_tokens_names: Sequence[str] = ("max_tokens",)
) -> SamplingInput:
    """Read the sampling fields of ``fields`` (the first of ``max_tokens_names`` present
    wins); 400 naming the field on a bad value."""
    names = [name for name in max_tokens_names if fields.has(name)] or [max_tokens_names[0]]
    top_k = fields.integer("top_k", None, lo=-1)
    return SamplingInput(
        max_tokens=fields.integer(names[0], None, lo=1),
        max_tokens_param=fields.param(names[0]),
        temperature=fields.number("temperature", 1.0, 0.0, 2.0),
        top_p=fields.number("top_p", 1.0, 0.0, 1.0, lo_open=True),
        top_k=None if top_k in (None, -1, 0) else top_k,
        seed=fields.integer("seed", None, lo=0, hi=2**63 - 1),
        n=fields.integer("n", 1, lo=1, hi=limits.max_n) or 1,
        stop=_stop_strings(fields),
        stop_token_ids=_stop_token_ids(fields, limits.vocab_size),
        ignore_eos=fields.boolean("ignore_eos", False),
    )


def generation_request(
    prompt_token_ids: tuple[int, ...],
    sampling: SamplingInput,
    limits: RequestLimits,
    prompt_param: str,
    scope: str = "anonymous",
    num_public_tokens: int = 0,
) -> GenerationRequest:
    """The engine request; 413 when the prompt leaves no room, 400 when ``max_tokens``
    does not fit the context."""
    room = limits.max_model_len - len(prompt_token_ids)
    if room < 1:
        raise context_too_long(prompt_param, len(prompt_token_ids), limits.max_model_len)
    max_tokens = sampling.max_tokens
    if max_tokens is None:
        max_tokens = min(limits.default_max_tokens, room)
    elif max_tokens > room:
        raise bad_request(
            f"{sampling.max_tokens_param} is {max_tokens}, but the context length is "
            f"{limits.max_model_len} and the prompt has {len(prompt_token_ids)} tokens "
            f"(at most {room} output tokens)",
            sampling.max_tokens_param,
        )
    params = SamplingParams(
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        seed=sampling.seed,
        max_tokens=max_tokens,
        stop_token_ids=sampling.stop_token_ids,
        ignore_eos=sampling.ignore_eos,
    )
    return GenerationRequest(
        prompt_token_ids,
        GenerationParams(params, sampling.n, sampling.stop),
        scope=scope,
        num_public_tokens=num_public_tokens,
    )


def _stop_strings(fields: Fields) -> tuple[str, ...]:
    value = fields.raw("stop")
    param = fields.param("stop")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if (
        not isinstance(items, list)
        or len(items) > MAX_STOP_STRINGS
        or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_LEN for s in items)
    ):
        raise bad_request(
            f"{param} must be a string or a list of at most {MAX_STOP_STRINGS} non-empty "
            f"strings of at most {MAX_STOP_LEN} characters",
            param,
        )
    return tuple(items)


def _stop_token_ids(fields: Fields, vocab_size: int) -> tuple[int, ...]:
    value = fields.raw("stop_token_ids")
    param = fields.param("stop_token_ids")
    if value is None or value == []:
        return ()
    if isinstance(value, list) and len(value) > MAX_STOP_TOKEN_IDS:
        raise bad_request(f"{param} may hold at most {MAX_STOP_TOKEN_IDS} ids", param)
    return token_id_list(value, param, vocab_size)
