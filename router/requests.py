"""Parsing OpenAI request bodies into what the router acts on.

Only fields the router understands are taken; each is type-checked and a wrong one is
an ``ApiError`` 400 naming it (``param``). The prompt itself is tokenized by
``router.tokenization``; nothing here trusts a length the client declares.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from router.errors import ApiError

COMPLETIONS = "completions"
CHAT = "chat"
MAX_N = 16


@dataclass(frozen=True)
class Sampling:
    """Sampling parameters in the worker's ``/generate`` vocabulary; None = worker default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    stop_token_ids: tuple[int, ...] | None = None
    ignore_eos: bool | None = None
    n: int = 1

    def to_wire(self, max_tokens: int | None) -> dict[str, Any]:
        """The ``sampling`` object of ``/generate`` with the router's output cap."""
        wire: dict[str, Any] = {"n": self.n}
        for name in ("temperature", "top_p", "top_k", "seed", "ignore_eos"):
            value = getattr(self, name)
            if value is not None:
                wire[name] = value
        if max_tokens is not None:
            wire["max_tokens"] = max_tokens
        if self.stop is not None:
            wire["stop"] = list(self.stop)
        if self.stop_token_ids is not None:
            wire["stop_token_ids"] = list(self.stop_token_ids)
        return wire


@dataclass(frozen=True)
class OpenAIRequest:
    """A parsed ``/v1/completions`` or ``/v1/chat/completions`` body. ``body`` is the
    client's JSON object, kept for forwarding to OpenAI-compatible workers."""

    endpoint: str
    model: Any
    body: dict[str, Any]
    stream: bool
    include_usage: bool
    sampling: Sampling


def decode_body(raw: bytes) -> dict[str, Any]:
    """The request's JSON object; ApiError 400 when it is not one."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    return body


def parse_request(body: dict[str, Any], endpoint: str) -> OpenAIRequest:
    """Validate the fields the router uses; ApiError 400 naming the first bad one."""
    if "model" not in body:
        raise ApiError(400, "model is required", param="model")
    stream = _typed(body, "stream", bool) or False
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", param="stream_options")
    include_usage = bool(options and options.get("include_usage"))
    max_tokens = _int(body, "max_tokens", 1)
    if endpoint == CHAT and max_tokens is None:
        max_tokens = _int(body, "max_completion_tokens", 1)
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list)
                             or not all(isinstance(s, str) and s for s in stop)):
        raise ApiError(400, "stop must be a string or a list of non-empty strings", param="stop")
    stop_ids = body.get("stop_token_ids")
    if stop_ids is not None and (not isinstance(stop_ids, list)
                                 or not all(type(t) is int and t >= 0 for t in stop_ids)):
        raise ApiError(400, "stop_token_ids must be a list of token ids", param="stop_token_ids")
    n = _int(body, "n", 1) or 1
    if n > MAX_N:
        raise ApiError(400, f"n must be at most {MAX_N}", param="n")
    sampling = Sampling(
        max_tokens=max_tokens,
        temperature=_float(body, "temperature"),
        top_p=_float(body, "top_p"),
        top_k=_int(body, "top_k", 0),
        seed=_int(body, "seed", None),
        stop=None if stop is None else tuple(stop),
        stop_token_ids=None if stop_ids is None else tuple(stop_ids),
        ignore_eos=_typed(body, "ignore_eos", bool),
        n=n,
    )
    return OpenAIRequest(endpoint, body["model"], body, stream, include_usage, sampling)


def _typed(body: dict[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    if value is not None and type(value) is not kind:
        raise ApiError(400, f"{name} must be a {kind.__name__}", param=name)
    return value


def _int(body: dict[str, Any], name: str, low: int | None) -> int | None:
    value = _typed(body, name, int)
    if value is not None and low is not None and value < low:
        raise ApiError(400, f"{name} must be at least {low}", param=name)
    return value


def _float(body: dict[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if type(value) not in (int, float) or value < 0:
        raise ApiError(400, f"{name} must be a non-negative number", param=name)
    return float(value)
