"""Typed reads of JSON request fields, each refusal a 400 naming the field.

JSON ``null`` counts as absent (OpenAI clients send explicit nulls). Booleans are
never numbers, numbers must be finite, strings and lists have length bounds. Token
id lists are checked at C speed (``array`` refuses non-integers and values outside
[0, 2**32); ``map(type, ...)`` finds booleans).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from array import array
from collections.abc import Iterable
from typing import Any

from radix.api_errors import bad_request
from radix.keys import TOKEN_BYTES, from_key

MAX_STRING_CHARS = 1 << 20


class Fields:
    """One JSON object; ``where`` prefixes field names in errors (``sampling.top_p``,
    ``stream_options.include_usage``)."""

    def __init__(self, data: object, where: str = "") -> None:
        if not isinstance(data, dict):
            raise bad_request(f"{where or 'request body'} must be a JSON object", where or None)
        self.data: dict[str, Any] = data
        self._where = where

    def param(self, name: str) -> str:
        """The dotted name of ``name`` as the client wrote it."""
        return f"{self._where}.{name}" if self._where else name

    def has(self, name: str) -> bool:
        """True when ``name`` is present and not null."""
        return self.data.get(name) is not None

    def raw(self, name: str) -> Any:
        """The value as parsed (None when absent)."""
        return self.data.get(name)

    def only(self, allowed: Iterable[str]) -> None:
        """Refuse (400 naming it) the first present field not in ``allowed``."""
        known = allowed if isinstance(allowed, (set, frozenset)) else set(allowed)
        if self.data.keys() <= known:
            return
        for name in self.data:
            if name not in known:
                raise bad_request(f"unknown field {self.param(name)!r}", self.param(name))

    def integer(
        self, name: str, default: int | None, lo: int | None = None, hi: int | None = None
    ) -> int | None:
        """An int in ``[lo, hi]`` (bounds optional), or ``default`` when absent."""
        value = self.data.get(name)
        if value is None:
            return default
        param = self.param(name)
        if type(value) is not int:
            raise bad_request(f"{param} must be an integer, got {describe(value)}", param)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bound = f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in [{lo}, {hi}]"
            raise bad_request(f"{param} must be {bound}, got {describe(value)}", param)
        return value

    def number(
        self, name: str, lo: float, hi: float, lo_open: bool = False
    ) -> float | None:
        """A finite number in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``), or None."""
        value = self.data.get(name)
        if value is None:
            return None
        param = self.param(name)
        if type(value) not in (int, float) or not math.isfinite(value):
            raise bad_request(f"{param} must be a number, got {describe(value)}", param)
        if value > hi or value < lo or (lo_open and value == lo):
            interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
            raise bad_request(f"{param} must be in {interval}, got {describe(value)}", param)
        return float(value)

    def boolean(self, name: str, default: bool) -> bool:
        """A JSON boolean, or ``default`` when absent."""
        value = self.data.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            param = self.param(name)
            raise bad_request(f"{param} must be a boolean, got {describe(value)}", param)
        return value

    def string(self, name: str, default: str | None, max_len: int = MAX_STRING_CHARS
               ) -> str | None:
        """A non-empty string of at most ``max_len`` characters, or ``default``."""
        value = self.data.get(name)
        if value is None:
            return default
        if not isinstance(value, str) or not value or len(value) > max_len:
            param = self.param(name)
            raise bad_request(
                f"{param} must be a non-empty string of at most {max_len} characters", param)
        return value

    def object(self, name: str) -> Fields:
        """A nested object (empty when absent)."""
        value = self.data.get(name)
        return Fields({} if value is None else value, self.param(name))


def token_id_list(value: object, param: str, vocab_size: int, max_len: int | None = None
                  ) -> tuple[int, ...]:
    """A non-empty list of at most ``max_len`` token ids in ``[0, vocab_size)``."""
    if not isinstance(value, list) or not value:
        raise bad_request(f"{param} must be a non-empty list of token ids", param)
    if max_len is not None and len(value) > max_len:
        raise bad_request(f"{param} may hold at most {max_len} token ids", param)
    try:
        packed = array("I", value)
    except (TypeError, OverflowError):
        packed = None
    if packed is None or max(packed) >= vocab_size or set(map(type, value)) != {int}:
        raise bad_request(f"{param} must hold integer token ids in [0, {vocab_size})", param)
    return tuple(value)


def token_ids_b64(value: object, param: str, vocab_size: int) -> tuple[bytes, tuple[int, ...]]:
    """Token ids sent as base64 of their ``radix.keys`` encoding (4 little-endian bytes
    per id), all in ``[0, vocab_size)``: the decoded key and its ids. Decoding is
    linear and runs at C speed."""
    if not isinstance(value, str) or not value:
        raise bad_request(f"{param} must be a non-empty base64 string", param)
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise bad_request(f"{param} is not valid base64: {exc}", param) from exc
    if not raw or len(raw) % TOKEN_BYTES:
        raise bad_request(
            f"{param} must decode to a non-empty multiple of {TOKEN_BYTES} bytes "
            f"({TOKEN_BYTES} little-endian bytes per token id), got {len(raw)} bytes",
            param,
        )
    token_ids = from_key(raw)
    if max(token_ids) >= vocab_size:
        raise bad_request(f"{param} must hold token ids in [0, {vocab_size})", param)
    return raw, tuple(token_ids)


def describe(value: object) -> str:
    """A short, safe rendering of a client value for an error message: scalars as JSON
    (cut at 40 characters), containers by kind only (their depth is the client's)."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 40 else text[:37] + "..."
