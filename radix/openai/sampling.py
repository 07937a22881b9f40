"""Sampling fields and their bounds, shared by the router, the worker's OpenAI routes
and the worker's ``/generate``.

Bounds: ``max_tokens`` in [1, 2**20] (each side then applies its own cap: the
tenant's limit on the router, the context left on the worker), ``temperature`` in
[0, 2], ``top_p`` in (0, 1], ``top_k`` in [-1, vocab size] (-1 and 0 mean off),
``seed`` in [0, 2**63), ``n`` in [1, max_n], ``stop`` at most 16 strings of 1 to 256
characters, ``stop_token_ids`` at most 64 ids in the vocabulary. Every refusal is a
400 naming the field the client sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from radix.api_errors import bad_request
from radix.openai.fields import Fields, token_id_list

MAX_TOKENS_LIMIT = 1 << 20
MAX_SEED = 2**63 - 1
DEFAULT_MAX_N = 16
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed", "n", "stop", "stop_token_ids",
                   "ignore_eos")


@dataclass(frozen=True)
class SamplingBounds:
    """What the bounds depend on: the vocabulary and the most choices per request."""

    vocab_size: int
    max_n: int = DEFAULT_MAX_N


@dataclass(frozen=True)
class Sampling:
    """Validated sampling fields; None means "not given" (each side has its defaults).
    ``max_tokens_param`` is the name the client used for ``max_tokens``."""

    max_tokens: int | None = None
    max_tokens_param: str = "max_tokens"
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    n: int = 1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool | None = None

    def to_wire(self, max_tokens: int | None) -> dict[str, Any]:
        """The fields that were given, in the shared vocabulary (``/generate``'s
        ``sampling`` object; top level for OpenAI backends), with ``max_tokens``
        replaced by the caller's cap."""
        wire: dict[str, Any] = {"n": self.n}
        for name in ("temperature", "top_p", "top_k", "seed", "ignore_eos"):
            value = getattr(self, name)
            if value is not None:
                wire[name] = value
        if max_tokens is not None:
            wire["max_tokens"] = max_tokens
        if self.stop:
            wire["stop"] = list(self.stop)
        if self.stop_token_ids:
            wire["stop_token_ids"] = list(self.stop_token_ids)
        return wire


def parse_sampling(
    fields: Fields, bounds: SamplingBounds, max_tokens_names: Sequence[str] = ("max_tokens",)
) -> Sampling:
    """Read the sampling fields of ``fields``; of ``max_tokens_names`` every one given
    is checked and the first given wins. 400 naming the field on a bad value."""
    given = [name for name in max_tokens_names if fields.has(name)] or [max_tokens_names[0]]
    max_tokens = [fields.integer(name, None, lo=1, hi=MAX_TOKENS_LIMIT) for name in given]
    return Sampling(
        max_tokens=max_tokens[0],
        max_tokens_param=fields.param(given[0]),
        temperature=fields.number("temperature", 0.0, 2.0),
        top_p=fields.number("top_p", 0.0, 1.0, lo_open=True),
        top_k=fields.integer("top_k", None, lo=-1, hi=bounds.vocab_size),
        seed=fields.integer("seed", None, lo=0, hi=MAX_SEED),
        n=fields.integer("n", 1, lo=1, hi=bounds.max_n) or 1,
        stop=_stop_strings(fields),
        stop_token_ids=_stop_token_ids(fields, bounds.vocab_size),
        ignore_eos=fields.boolean("ignore_eos", False) if fields.has("ignore_eos") else None,
    )


def _stop_strings(fields: Fields) -> tuple[str, ...]:
    value = fields.raw("stop")
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if (
        not isinstance(items, list)
        or len(items) > MAX_STOP_STRINGS
        or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in items)
    ):
        param = fields.param("stop")
        raise bad_request(
            f"{param} must be a string or a list of at most {MAX_STOP_STRINGS} non-empty "
            f"strings of at most {MAX_STOP_CHARS} characters",
            param,
        )
    return tuple(items)


def _stop_token_ids(fields: Fields, vocab_size: int) -> tuple[int, ...]:
    value = fields.raw("stop_token_ids")
    if value is None or value == []:
        return ()
    return token_id_list(value, fields.param("stop_token_ids"), vocab_size, MAX_STOP_TOKEN_IDS)
