"""An SGLang server probed as an OpenAI-compatible worker of its own kind: its page
size from its ``sglang:page_size`` gauge (what the router cuts a match to), its load
from its ``sglang:`` gauges, and a namespace of its own (its blocks never share a
tree with a vLLM server's, whose block size may differ)."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from router.fleet.probes import openai_namespace, probe_openai
from router.models import Models
from tests.support.aio import TEST_SECRET, serving
from tests.support.router_configs import make_config

pytestmark = pytest.mark.anyio
METRICS = """# HELP sglang:page_size KV cache page size in tokens.
# TYPE sglang:page_size gauge
sglang:page_size{model_name="demo"} 16.0
sglang:num_running_reqs{model_name="demo"} 3.0
sglang:num_queue_reqs{model_name="demo"} 2.0
"""


def sglang_server(metrics: str) -> web.Application:
    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "demo", "object": "model"}]})

    async def prometheus(_: web.Request) -> web.Response:
        return web.Response(text=metrics)

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", prometheus)
    return app


@pytest.mark.parametrize(("metrics", "block_size"), [(METRICS, 16), ("", None)])
async def test_an_sglang_server_reports_its_page_size_load_and_namespace(
        metrics: str, block_size: int | None) -> None:
    model = Models.from_config(make_config(["http://127.0.0.1:9"]).models).get("demo")
    async with serving(sglang_server(metrics)) as url, aiohttp.ClientSession() as session:
        result = await probe_openai(session, url, {}, 5.0, model, TEST_SECRET, "sglang")
    assert result.ready and result.served_model == "demo"
    assert result.cache_block_size == block_size
    assert result.namespace == openai_namespace(model, TEST_SECRET, "sglang")
    assert result.namespace != openai_namespace(model, TEST_SECRET, "vllm")
    if metrics:
        assert (result.load.num_requests_running, result.load.num_requests_waiting) == (3, 2)
