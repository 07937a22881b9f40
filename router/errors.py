"""The router's refusals are ``radix.api_errors.ApiError`` (OpenAI-shaped): handlers
raise it anywhere in dispatch and the server answers with its status, body and
headers."""

from radix.api_errors import ApiError

__all__ = ["ApiError"]
