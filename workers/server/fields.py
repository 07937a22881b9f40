"""Typed reads of JSON request fields with OpenAI-style 400s naming the field.

JSON ``null`` counts as absent (OpenAI clients send explicit nulls). Booleans are
never accepted as numbers, numbers must be finite, and unknown fields are
ignored, as OpenAI does.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any

from radix.keys import TOKEN_BYTES, from_key
from workers.server.errors import bad_request


def parse_json_object(raw: bytes) -> Fields:
    """The request body as ``Fields``; 400 if it is not a UTF-8 JSON object."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"request body is not valid JSON: {exc}") from exc
    return Fields(data, "")


class Fields:
    """One JSON object; ``where`` prefixes field names in errors (``sampling.top_p``)."""

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, dict):
            raise bad_request(f"{where or 'request body'} must be a JSON object", where or None)
        self.data: dict[str, Any] = data
        self._where = where

    def param(self, name: str) -> str:
        """The dotted name of ``name`` for error messages."""
        return f"{self._where}.{name}" if self._where else name

    def has(self, name: str) -> bool:
        """True when ``name`` is present and not null."""
        return self.data.get(name) is not None

    def raw(self, name: str) -> Any:
        """The value as parsed (None when absent)."""
        return self.data.get(name)

    def integer(
        self, name: str, default: int | None, lo: int | None = None, hi: int | None = None
    ) -> int | None:
        """An int in ``[lo, hi]`` (bounds optional), or ``default`` when absent."""
        value = self.data.get(name)
        if value is None:
            return default
        if type(value) is not int:
            raise bad_request(f"{self.param(name)} must be an integer, got {_show(value)}", self.param(name))
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            bound = f">= {lo}" if hi is None else f"<= {hi}" if lo is None else f"in [{lo}, {hi}]"
            raise bad_request(f"{self.param(name)} must be {bound}, got {value}", self.param(name))
        return value

    def number(
        self, name: str, default: float, lo: float, hi: float, lo_open: bool = False
    ) -> float:
        """A finite number in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``), or ``default``."""
        value = self.data.get(name)
        if value is None:
            return default
        if type(value) not in (int, float) or not math.isfinite(value):
            raise bad_request(f"{self.param(name)} must be a number, got {_show(value)}", self.param(name))
        if value > hi or value < lo or (lo_open and value == lo):
            interval = f"{'(' if lo_open else '['}{lo}, {hi}]"
            raise bad_request(f"{self.param(name)} must be in {interval}, got {value}", self.param(name))
        return float(value)

    def boolean(self, name: str, default: bool) -> bool:
        """A JSON boolean, or ``default`` when absent."""
        value = self.data.get(name)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise bad_request(f"{self.param(name)} must be a boolean, got {_show(value)}", self.param(name))
        return value

    def string(self, name: str, default: str | None, max_len: int = 1 << 20) -> str | None:
        """A non-empty string of at most ``max_len`` characters, or ``default``."""
        value = self.data.get(name)
        if value is None:
            return default
        if not isinstance(value, str) or not value or len(value) > max_len:
            raise bad_request(
                f"{self.param(name)} must be a non-empty string of at most {max_len} characters",
                self.param(name),
            )
        return value

    def object(self, name: str) -> Fields:
        """A nested object (empty when absent)."""
        value = self.data.get(name)
        return Fields({} if value is None else value, self.param(name))


def token_id_list(value: object, param: str, vocab_size: int) -> tuple[int, ...]:
    """A non-empty list of token ids in ``[0, vocab_size)``."""
    if not isinstance(value, list) or not value:
        raise bad_request(f"{param} must be a non-empty list of token ids", param)
    if not all(type(t) is int and 0 <= t < vocab_size for t in value):
        raise bad_request(f"{param} must hold integer token ids in [0, {vocab_size})", param)
    return tuple(value)


def token_ids_b64(value: object, param: str, vocab_size: int) -> tuple[int, ...]:
    """Token ids sent as base64 of their ``radix.keys`` encoding (4 little-endian bytes
    per id), all in ``[0, vocab_size)``. Decoding is linear and runs at C speed
    (``base64`` then ``array.frombytes``); 400 naming ``param`` when malformed."""
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
    return tuple(token_ids)


def _show(value: object) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."
