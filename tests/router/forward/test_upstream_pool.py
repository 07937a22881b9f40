"""``router.forward.pool`` against scripted upstream servers on loopback: bodies
framed by ``Content-Length`` and by chunks, keep-alive reuse, a connection the
upstream closed while idle (the request goes again on a new one, once), a body cut
short, a refused connection and the total timeout."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from router.forward.pool import UpstreamConnectError, UpstreamError, UpstreamPool

pytestmark = pytest.mark.anyio
Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, int], Awaitable[None]]


@contextlib.asynccontextmanager
async def upstream(script: Script) -> AsyncIterator[tuple[str, list[int]]]:
    """A server running ``script(reader, writer, connection_number)`` per connection;
    yields its URL and the list of connection numbers opened so far."""
    opened: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opened.append(len(opened))
        try:
            await script(reader, writer, opened[-1])
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", opened
    finally:
        server.close()


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return await reader.readexactly(length)


def answer(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)


async def test_bodies_by_length_and_by_chunks_and_connection_reuse() -> None:
    async def script(reader, writer, number):
        body = await read_request(reader)
        writer.write(answer(b"echo " + body))
        body = await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"6\r\nline 1\r\n8\r\n\nline 2\n\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async with upstream(script) as (url, opened):
        pool = UpstreamPool(1.0, 5.0)
        response = await pool.post(url, "/a", {}, b"one")
        assert (response.status, await response.read()) == (200, b"echo one")
        response.close()
        response = await pool.post(url, "/b", {}, b"two")
        assert await response.read() == b"line 1\nline 2\n"
        assert await response.readany() == b""
        response.close()
        assert opened == [0]
        pool.close()


async def test_every_request_carries_the_headers_it_was_given() -> None:
    heads: list[bytes] = []

    async def script(reader, writer, number):
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            heads.append(head + await reader.readexactly(length))
            writer.write(answer(b"ok"))

    async with upstream(script) as (url, _):
        pool = UpstreamPool(1.0, 5.0)
        first = {"Authorization": "Bearer one"}
        for headers, body in ((first, b"1"), (first, b"22"), ({"X-Key": "two"}, b"333")):
            response = await pool.post(url + "/base/", "/generate", headers, body)
            assert await response.read() == b"ok"
            response.close()
        pool.close()
    port = url.rsplit(":", 1)[1]
    assert heads == [
        b"POST /base/generate HTTP/1.1\r\nHost: 127.0.0.1:%b\r\n%b\r\nContent-Type: "
        b"application/json\r\nContent-Length: %d\r\n\r\n%b" % (port.encode(), header,
                                                                len(body), body)
        for header, body in ((b"Authorization: Bearer one", b"1"),
                             (b"Authorization: Bearer one", b"22"), (b"X-Key: two", b"333"))]


async def test_a_connection_closed_while_idle_is_replaced_once() -> None:
    async def script(reader, writer, number):
        await read_request(reader)
        writer.write(answer(b"from %d" % number))
        await writer.drain()  # then close: the pool holds a dead idle connection

    async with upstream(script) as (url, opened):
        pool = UpstreamPool(1.0, 5.0)
        for number in range(2):
            response = await pool.post(url, "/", {}, b"x")
            assert await response.read() == b"from %d" % number
            response.close()
            await asyncio.sleep(0.05)
        assert opened == [0, 1]
        pool.close()


async def test_a_body_cut_short_fails_and_the_connection_is_not_reused() -> None:
    async def script(reader, writer, number):
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()

    async with upstream(script) as (url, opened):
        pool = UpstreamPool(1.0, 5.0)
        response = await pool.post(url, "/", {}, b"x")
        with pytest.raises(UpstreamError):
            await response.read()
        response.close()
        pool.close()


async def test_a_refused_connection_and_the_total_timeout() -> None:
    async def silent(reader, writer, number):
        await reader.read()

    pool = UpstreamPool(1.0, 0.2)
    async with upstream(silent) as (url, _):
        with pytest.raises(TimeoutError):
            await pool.post(url, "/", {}, b"x")
    with pytest.raises(UpstreamConnectError):
        await pool.post(url, "/", {}, b"x")
    pool.close()


async def test_a_path_in_the_worker_url_prefixes_every_request() -> None:
    targets: list[bytes] = []

    async def script(reader, writer, number):
        head = await reader.readuntil(b"\r\n\r\n")
        targets.append(head.split(b" ")[1])
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        await reader.readexactly(length)
        writer.write(answer(b"ok"))
        await writer.drain()
        await reader.read()

    async with upstream(script) as (url, _):
        pool = UpstreamPool(1.0, 5.0)
        response = await pool.post(f"{url}/backend-a/", "/v1/completions", {}, b"x")
        assert await response.read() == b"ok"
        response.close()
        assert targets == [b"/backend-a/v1/completions"]
        pool.close()


def endless(start: bytes, sent: list[int]) -> Script:
    """A worker that answers ``start`` and then ``a`` without end (up to 16 MiB),
    counting in ``sent`` what it got to send before the router dropped it."""
    async def script(reader, writer, number):
        await read_request(reader)
        writer.write(start)
        with contextlib.suppress(OSError):
            for _ in range(256):
                writer.write(b"a" * 65536)
                await writer.drain()
                sent[0] += 65536
    return script


@pytest.mark.parametrize("start", [
    b"HTTP/1.1 200 OK\r\nX-Big: ",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nX-Trailer: ",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;ext=",
])
async def test_an_answer_head_or_framing_that_never_ends_fails_at_its_bound(
        start: bytes) -> None:
    """A worker's header, trailer or chunk extension that never ends is a failed
    attempt once it passes its bound, not a buffer that grows with what it sends."""
    sent = [0]
    async with upstream(endless(start, sent)) as (url, _):
        pool = UpstreamPool(1.0, 10.0)
        with pytest.raises(UpstreamError, match="over 65536 bytes"):
            response = await pool.post(url, "/", {}, b"x")
            try:
                await response.read()
            finally:
                response.close()
        pool.close()
    assert sent[0] < 8 << 20
