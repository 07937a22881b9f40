"""The lean server's request parser (``router.server.http1_requests``) on its own: a
tenant's body bound applies to a body that arrived in full before the bound was
known (a pipelined or queued request), not only to bytes still to come; and past
``UNBOUNDED_BODY_BYTES`` of a body with no bound yet the parser asks the connection
to stop reading."""

from __future__ import annotations

import asyncio

import pytest

from radix.api_errors import ApiError
from router.server.http1_requests import (
    MAX_FRAMING_BYTES,
    UNBOUNDED_BODY_BYTES,
    Message,
    RequestParser,
    chunk,
)


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


def fed_in_pieces(head: bytes, filler: bytes, max_bytes: int) -> tuple[ApiError | None, int]:
    """Feed ``head``, then ``filler`` in pieces up to ``max_bytes``: the error that
    stopped the parser, and how many bytes it took."""
    loop = asyncio.new_event_loop()
    parser = RequestParser(loop, 32 << 20, {b"/v1/completions": "completions"},
                           lambda message: None, lambda: None, lambda: None)
    fed, error = len(head), parser.feed(head)
    while error is None and fed < max_bytes:
        fed += len(filler)
        error = parser.feed(filler)
    loop.close()
    return error, fed


CHUNKED_POST = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")


@pytest.mark.parametrize("start", [b"0\r\nX-Trailer: ", b"0\r\nX", b"1;ext="])
def test_framing_that_never_ends_is_refused_past_its_budget(start: bytes) -> None:
    """A trailer value or name, or a chunk extension, that never ends: 400
    ``framing_too_large`` once the body's non-payload bytes pass the budget, not
    after what a client chooses to send."""
    error, fed = fed_in_pieces(CHUNKED_POST + start, b"a" * 4096, 16 << 20)
    assert error is not None and (error.status, error.code) == (400, "framing_too_large")
    assert fed <= len(CHUNKED_POST) + MAX_FRAMING_BYTES + 2 * 4096


def test_ordinary_chunks_stay_within_the_framing_budget() -> None:
    """32 MiB in 1 KiB chunks (7 framing bytes each) is a body, not an attack."""
    error, _ = fed_in_pieces(CHUNKED_POST, chunk(b"x" * 1024) * 64, 32 << 20)
    assert error is None


def test_tiny_chunks_are_refused_once_framing_outweighs_the_budget() -> None:
    """One-byte chunks spend 5 framing bytes per payload byte: refused after about
    13,000 of them."""
    error, fed = fed_in_pieces(CHUNKED_POST, chunk(b"x") * 1024, 1 << 20)
    assert error is not None and error.code == "framing_too_large"
    assert fed < 128 * 1024
