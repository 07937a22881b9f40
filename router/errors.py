"""OpenAI-shaped client errors: every refusal the router makes is an ``ApiError``.

Handlers raise it anywhere in dispatch; the server turns it into
``{"error": {"message", "type", "param", "code"}}`` with its status and headers.
Client input never produces a 500.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable_error",
}


class ApiError(Exception):
    """A refusal with an HTTP ``status``, an OpenAI error ``type`` derived from it, the
    offending request field (``param``), a machine-readable ``code`` and extra headers
    (``Retry-After`` for 429)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] = MappingProxyType({}),
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers)

    @property
    def error_type(self) -> str:
        """The OpenAI ``error.type`` for this status."""
        return _TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")

    def body(self) -> dict[str, object]:
        """The JSON error body."""
        return {
            "error": {
                "message": self.message,
                "type": self.error_type,
                "param": self.param,
                "code": self.code,
            }
        }
