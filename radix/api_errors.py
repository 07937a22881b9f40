"""OpenAI-shaped errors, one definition for router and worker.

Every refusal either side makes is an ``ApiError``; its ``body()`` is
``{"error": {"message", "type", "param", "code"}}`` with the OpenAI error type for
the HTTP status. Each server turns it into a response (status, body, headers such
as ``Retry-After``); client input never produces a 500.
"""

from __future__ import annotations

from collections.abc import Mapping

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


def error_type(status: int) -> str:
    """The OpenAI ``error.type`` for an HTTP status."""
    return _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, object]:
    """``{"error": {...}}`` for ``status``."""
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


class ApiError(Exception):
    """A refusal with an HTTP ``status``, the offending request field (``param``), a
    machine-readable ``code`` and extra response ``headers`` (``Retry-After`` for 429)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, object]:
        """The JSON error body."""
        return error_body(self.status, self.message, self.param, self.code)


def bad_request(message: str, param: str | None = None) -> ApiError:
    """A 400 naming the bad field."""
    return ApiError(400, message, param=param, code="invalid_value")
