"""The published OpenAPI documents (``radix.http_api``) against the apps they describe:
each lists exactly the routes its app registers (so neither can drift), the apps serve
it as ``GET /openapi.json`` without a key, and every reference resolves."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
from aiohttp import web

from radix.generate import PATH as GENERATE_PATH
from radix.generate import WIRE_FIELDS, GenerateRequest
from radix.http_api import load_document
from radix.keys import to_key
from radix.openai.sampling import Sampling
from router.config_toml import parse_config
from router.context import Router
from router.server.app import create_app as create_router_app
from router.state.shared_state import InProcessSharedState
from tests.support.aio import TEST_SECRET, running_router, serving
from workers.build import build_worker
from workers.config import KVSettings, WorkerConfig
from workers.server.app import create_app as create_worker_app
from workers.server.state import ServerState

METHODS = {"get", "post", "put", "patch", "delete"}


def documented(document: dict) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, item in document["paths"].items()
            for method in item if method in METHODS}


def registered(app: web.Application) -> set[tuple[str, str]]:
    """(method, path) of every route but the HEAD aiohttp adds beside each GET."""
    return {(route.method, route.resource.canonical) for route in app.router.routes()
            if route.method != "HEAD"}


def router_config():
    return parse_config({"models": {"demo": {"tokenizer": "demo"}}})


def worker_state(api_key: str | None = None) -> ServerState:
    config = WorkerConfig(kv=KVSettings(cache_bytes=2 * 2**20))
    return ServerState(config.server, build_worker(config, "w", b"secret"), api_key=api_key)


def test_router_document_lists_exactly_the_routes_the_router_registers():
    async def main() -> set[tuple[str, str]]:
        router = Router.build(router_config(), TEST_SECRET, InProcessSharedState())
        try:
            return registered(create_router_app(router))
        finally:
            await router.close()

    assert asyncio.run(main()) == documented(load_document("router"))


def test_worker_document_lists_exactly_the_routes_the_worker_registers():
    assert registered(create_worker_app(worker_state())) == documented(load_document("worker"))


def test_the_generate_body_documented_is_the_one_radix_generate_defines():
    schema = (load_document("worker")["paths"][GENERATE_PATH]["post"]["requestBody"]
              ["content"]["application/json"]["schema"])
    assert sorted(schema["properties"]) == sorted(WIRE_FIELDS)
    request = GenerateRequest(to_key([1, 2]), "t", Sampling(max_tokens=3), stream=True,
                              num_public_tokens=16, num_resumed_tokens=1,
                              max_cached_tokens=4, request_id="r", adapter="a")
    assert set(request.to_wire()) <= set(schema["properties"])


def test_both_apps_serve_their_document_without_a_key():
    async def fetch(url: str) -> tuple[int, str, dict]:
        async with aiohttp.ClientSession() as session, session.get(f"{url}/openapi.json") as r:
            return r.status, r.content_type, json.loads(await r.read())

    async def main() -> None:
        async with running_router(router_config()) as (url, _):
            assert await fetch(url) == (200, "application/json", load_document("router"))
        async with serving(create_worker_app(worker_state("worker-key"))) as url:
            assert await fetch(url) == (200, "application/json", load_document("worker"))

    asyncio.run(main())


@pytest.mark.parametrize("server", ["router", "worker"])
def test_every_reference_resolves_inside_the_document(server: str):
    document = load_document(server)

    def refs(node):
        if isinstance(node, dict):
            for key, value in node.items():
                yield from ([value] if key == "$ref" else refs(value))
        elif isinstance(node, list):
            for item in node:
                yield from refs(item)

    for ref in refs(document):
        assert ref.startswith("#/"), ref
        target = document
        for part in ref[2:].split("/"):
            target = target[part]
