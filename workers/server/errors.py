"""OpenAI-shaped error responses.

Every error the worker returns has the body
``{"error": {"message", "type", "param", "code"}}``. Handlers raise ``ApiError``; the
error middleware (``workers.server.app``) turns it, aiohttp's own HTTP errors and
any unexpected exception (logged, status 500) into that body.
"""

from __future__ import annotations

from aiohttp import web

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
    504: "timeout_error",
}


class ApiError(Exception):
    """A request the worker refuses, with its HTTP status and the offending ``param``."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, object]:
        """The JSON error object."""
        return error_body(self.status, self.message, self.param, self.code)

    def response(self) -> web.Response:
        """The JSON error response."""
        return web.json_response(self.body(), status=self.status, headers=self.headers)


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, object]:
    """``{"error": {...}}`` with the OpenAI error type for ``status``."""
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None) -> ApiError:
    """A 400 naming the bad field."""
    return ApiError(400, message, param, "invalid_value")


def context_too_long(param: str, num_tokens: int, max_model_len: int) -> ApiError:
    """The 413 for a prompt of ``num_tokens`` that leaves no room for output."""
    return ApiError(
        413,
        f"this model's maximum context length is {max_model_len} tokens; the prompt has "
        f"{num_tokens} tokens and at least one output token is needed",
        param,
        "context_length_exceeded",
    )
