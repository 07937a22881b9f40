"""What an ``openai``-kind backend's answers must not tell a client: the backend's
model name (often a filesystem path: ``/models/qwen-7b``) and its own error texts
(addresses, tracebacks, versions).

``ModelRenamer`` gives every streamed chunk the router's model name, as the whole
answers already get. ``refusal`` turns a backend's 4xx into the router's own
OpenAI-style error, keeping only the status and a field name; the caller logs the
backend's text under the request id.
"""

from __future__ import annotations

import re

import orjson

from radix.api_errors import ApiError

_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,63}$")


class ModelRenamer:
    """Rewrites the ``model`` of OpenAI stream lines (``data: {...}\\n``) to ``ours``.

    Cheap on the usual line: a backend echoes the model id it was sent
    (``backend``), so ``"model":"<backend>"`` is replaced in the bytes (an unescaped
    ``"model":"`` can only be a key, never text inside a string). Any other line
    naming a model is parsed and written again."""

    def __init__(self, ours: str, backend: str | None) -> None:
        self._ours_value = ours
        self._ours = b'"model":' + orjson.dumps(ours)
        self._theirs = b'"model":' + orjson.dumps(backend) if backend is not None else None

    def __call__(self, line: bytes) -> bytes:
        """``line`` with its chunk's model as ``ours``; ValueError if a ``data: {``
        line naming a model is not JSON."""
        if not line.startswith(b"data: {") or b'"model"' not in line:
            return line
        if self._theirs is not None and self._theirs in line:
            return line.replace(self._theirs, self._ours, 1)
        chunk = orjson.loads(line[6:])
        if not isinstance(chunk, dict) or "model" not in chunk:
            return line
        chunk["model"] = self._ours_value
        body = line.rstrip(b"\r\n")
        return b"data: " + orjson.dumps(chunk) + line[len(body):]


def refusal(error: ApiError) -> ApiError:
    """The router's own error for a backend's client error: the same status and field
    name (``param``, when it is a plain field name), none of the backend's text."""
    param = error.param if error.param and _FIELD_NAME.fullmatch(error.param) else None
    return ApiError(error.status, f"the model backend refused this request (HTTP "
                                  f"{error.status}); quote the X-Request-Id when reporting it",
                    param=param, code="backend_refused")
