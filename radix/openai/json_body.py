"""Request bytes -> a JSON object, refusing everything that is not plain JSON text.

Python's ``json`` accepts ``NaN``/``Infinity``, decodes bytes with
``surrogatepass`` and keeps lone surrogates from ``\\ud800`` escapes; any of those
would reach the tokenizer or a backend as a 500. Here the bytes must be strict UTF-8,
constants are refused, nesting deeper than the parser's recursion limit is a 400, and
a string holding a lone surrogate is a 400 naming where it sits.

Bodies are parsed by ``orjson`` (strict: UTF-8, no constants, no lone surrogates,
bounded depth; several times faster). What it refuses is parsed again by ``json``
under the rules above, which accepts what orjson cannot hold (integers past 64 bits,
numbers past a double: the fields' own bounds then name them) and words the error.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from radix.api_errors import ApiError

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _refuse_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def decode_json_object(raw: bytes) -> dict[str, Any]:
    """The body as a dict; ApiError 400 (``invalid_json``) for anything else."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _decode_strictly(raw)
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object", code="invalid_json")
    return body


def _decode_strictly(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
        body = json.loads(text, parse_constant=_refuse_constant)
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"request body is not valid UTF-8: {exc.reason} at byte "
                       f"{exc.start}", code="invalid_json") from exc
    except ValueError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from exc
    except RecursionError as exc:
        raise ApiError(400, "request body is nested too deeply", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object", code="invalid_json")
    if _SURROGATE_ESCAPE.search(text):
        _refuse_lone_surrogates(body)
    return body


def _refuse_lone_surrogates(body: dict[str, Any]) -> None:
    """Walk the parsed body (iteratively: its depth is the client's) and refuse the
    first string, key or value, that is not encodable as UTF-8."""
    stack: list[tuple[str, Any]] = [("", body)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            for key, item in value.items():
                path = f"{where}.{key}" if where else key
                _check_text(key, path)
                stack.append((path, item))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in enumerate(value))
        elif isinstance(value, str):
            _check_text(value, where)


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        param = where.encode("utf-8", "backslashreplace").decode()
        raise ApiError(400, f"{param} holds a lone UTF-16 surrogate (invalid Unicode)",
                       param=param, code="invalid_unicode") from exc
