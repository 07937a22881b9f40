"""Request ids: every response carries ``X-Request-Id``, and the log says what failed.

A client's own ``X-Request-Id`` (1-128 characters of letters, digits and ``._:-``)
is kept and echoed; otherwise the router makes one. Error bodies sent to clients
name no worker address and no exception text: the detail goes to the log under
this id, and the client quotes the id to the operator.
"""

from __future__ import annotations

import re
import uuid

from aiohttp import web
from aiohttp.typedefs import Handler

HEADER = "X-Request-Id"
_KEY = web.RequestKey("request_id", str)
VALID_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def request_id(request: web.Request) -> str:
    """The id of ``request`` (assigned by ``request_id_middleware``)."""
    return request.get(_KEY, "-")


@web.middleware
async def request_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Assign the request's id before anything else runs (see the module docstring)."""
    given = request.headers.get(HEADER, "")
    request[_KEY] = given if VALID_ID.fullmatch(given) else uuid.uuid4().hex
    return await handler(request)


async def add_request_id_header(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare`` hook: put the id on every response, streamed or not,
    errors included, before its headers are sent."""
    response.headers[HEADER] = request_id(request)
