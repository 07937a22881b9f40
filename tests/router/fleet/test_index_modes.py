"""A radix worker whose namespace declares block keys the router's index does not match
(``key_mode`` ``bigram``: EAGLE-style keys of a block and the next token) is routed
approximately, with the reason in ``GET /admin/workers``, and its KV events are never
read; a worker of plain block keys beside it is followed as always. A real router in
this process in front of two stand-in workers on loopback."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from radix.namespace import CacheNamespace
from radix.tokenizer import PromptTokenizer
from tests.support.aio import eventually, running_router, serving
from tests.support.router_configs import make_config

pytestmark = pytest.mark.anyio


def stand_in(key_mode: str, event_streams: list[str]) -> web.Application:
    """A ready, idle radix worker of the demo tokenizer whose namespace has
    ``key_mode``; each ``GET /kv/events`` appends the mode to ``event_streams`` and
    gets an empty snapshot and a heartbeat, then silence."""
    digest = PromptTokenizer.demo().digest
    namespace = CacheNamespace("stand-in", "none", digest, key_mode=key_mode)
    identity = {"ready": True, "worker_id": key_mode or "plain", "epoch": "e1",
                "model": "demo", "namespace": namespace.to_dict(),
                "namespace_digest": namespace.fingerprint(b"worker"),
                "tokenizer_digest": digest, "block_size": namespace.block_size}

    async def ready(request: web.Request) -> web.Response:
        return web.json_response(identity)

    async def info(request: web.Request) -> web.Response:
        return web.json_response({**identity, "load": {}})

    async def events(request: web.Request) -> web.StreamResponse:
        event_streams.append(key_mode)
        out = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await out.prepare(request)
        await out.write(json.dumps({
            "worker": identity["worker_id"], "epoch": "e1", "seq": 0, "type": "cleared",
            "namespace": identity["namespace_digest"], "scope": "public"}).encode() + b"\n\n")
        await asyncio.sleep(30)
        return out

    app = web.Application()
    app.add_routes([web.get("/ready", ready), web.get("/info", info),
                    web.get("/kv/events", events)])
    return app


async def test_events_of_an_unmatched_key_mode_are_refused_and_the_worker_routed_approximately():
    streams: list[str] = []
    async with serving(stand_in("", streams)) as plain, \
            serving(stand_in("bigram", streams)) as bigram, \
            running_router(make_config([plain, bigram])) as (_, router):
        by_id = {w.worker_id: w for w in router.registry.workers()}
        await eventually(lambda: by_id["u0"].index_mode == "exact" and streams,
                         describe=lambda: (by_id["u0"].index_reason, streams))
        await asyncio.sleep(0.3)  # several probe rounds: the bigram worker's stream stays unread
        assert by_id["u1"].ready and by_id["u1"].index_mode == "approximate"
        assert "key mode 'bigram'" in by_id["u1"].index_reason
        assert streams == [""]
        assert router.registry.namespaces.num_namespaces("demo") == 2
