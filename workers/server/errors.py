"""OpenAI-shaped error responses.

Every error the worker returns has the body
``{"error": {"message", "type", "param", "code"}}``. Handlers raise ``ApiError``; the
error middleware (``workers.server.app``) turns it, aiohttp's own HTTP errors and
any unexpected exception (logged, status 500) into that body.
"""

from __future__ import annotations

from aiohttp import web

from radix.api_errors import ApiError, bad_request, error_body

__all__ = ["ApiError", "bad_request", "context_too_long", "error_body", "error_response"]


def error_response(error: ApiError) -> web.Response:
    """The JSON response for ``error``: its status, body and headers."""
    return web.json_response(error.body(), status=error.status, headers=error.headers)


def context_too_long(param: str, num_tokens: int, max_model_len: int) -> ApiError:
    """The 413 for a prompt of ``num_tokens`` that leaves no room for output."""
    return ApiError(
        413,
        f"this model's maximum context length is {max_model_len} tokens; the prompt has "
        f"{num_tokens} tokens and at least one output token is needed",
        param=param,
        code="context_length_exceeded",
    )
