"""The lean server's request parser (``router.server.http1_requests``) on its own: a
tenant's body bound applies to a body that arrived in full before the bound was
known (a pipelined or queued request), not only to bytes still to come; and past
``UNBOUNDED_BODY_BYTES`` of a body with no bound yet the parser asks the connection
to stop reading."""

from __future__ import annotations

import asyncio

import pytest

from radix.api_errors import ApiError
from router.server.http1_requests import UNBOUNDED_BODY_BYTES, Message, RequestParser, chunk


def parsed(body: bytes, holds: list[int] | None = None) -> Message:
    """The message of one chunked POST carrying ``body``, fed in one piece; each time
    the parser asks to hold the body, its size then goes to ``holds``."""
    loop = asyncio.new_event_loop()
    messages: list[Message] = []
    parser = RequestParser(loop, 32 << 20, {b"/v1/completions": "completions"},
                           messages.append, lambda: None,
                           lambda: (holds if holds is not None else []).append(messages[0].size))
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               + chunk(body) + b"0\r\n\r\n")
    assert parser.feed(request) is None
    loop.close()  # the futures outlive it: only their results are read
    (message,) = messages
    assert message.body.done()
    return message


def test_a_complete_body_past_the_bound_is_refused() -> None:
    message = parsed(b"x" * 133_000)
    message.limit_body(66_000)
    with pytest.raises(ApiError) as refused:
        message.body.result()
    assert (refused.value.status, refused.value.code) == (413, "request_too_large")


def test_a_complete_body_within_the_bound_is_kept() -> None:
    message = parsed(b"x" * 1000)
    message.limit_body(66_000)
    assert message.body.result() == b"x" * 1000


def test_a_body_without_its_bound_is_held_past_the_unbounded_allowance() -> None:
    holds: list[int] = []
    parsed(b"x" * UNBOUNDED_BODY_BYTES, holds)
    assert holds == []
    parsed(b"x" * (UNBOUNDED_BODY_BYTES + 1), holds)
    assert holds == [UNBOUNDED_BODY_BYTES + 1]
