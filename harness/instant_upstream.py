"""A stand-in upstream that answers instantly, for measuring the router's own overhead.

This is NOT a worker: it runs no model and caches nothing. It speaks just enough of
the worker HTTP API (docs/protocol.md) for a router to accept and use it: ``/ready``
and ``/info`` report the tokenizer's digest (``--tokenizer``, the demo one by
default) and a fixed namespace, ``/kv/events`` sends an empty snapshot and then
heartbeats, ``/generate`` returns ``max_tokens`` fixed tokens at once (streamed as
one SSE event per token; rendered as a worker renders them when asked), and the
OpenAI routes answer the same way so it can also stand in for an ``openai``-kind
worker, behind our router or behind the peer routers (``/server_info``,
``/model_info`` for sglang-router; ``/tokenize`` and the ``/render`` routes with the
tokenizer for vllm-router). With ``--lru-tokens`` it records prompt reuse
(``harness.reuse.ReuseMeter``: the longest prefix of each OpenAI prompt it had already
seen, unlimited and under an LRU cap of that many tokens; text prompts tokenized
with its tokenizer, as our router tokenizes them), served at ``GET /reuse`` and
cleared by ``POST /reuse/reset``; with ``--delay-ms`` an OpenAI answer comes after
that delay (the reference harness, ``bench.reference``).

``python -m harness.instant_upstream --port 0`` prints ``READY http://HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import uuid
from collections.abc import Awaitable, Callable

from aiohttp import web

from harness.reuse import ReuseMeter
from radix.generate import GenerateRequest, Step, step_event, usage_event, whole_answer
from radix.model_source import DEMO_MODEL, load_tokenizer
from radix.namespace import CacheNamespace
from radix.openai.fields import Fields
from radix.openai.prompt import encode_messages
from radix.openai.rendered import RenderedAnswer
from radix.openai.requests import CHAT, COMPLETIONS
from radix.openai.responses import ChoiceText, ResponseShape, TokenUsage
from radix.openai.sampling import SamplingBounds
from radix.tokenizer import PromptTokenizer
from router.server.app import bind_socket

BLOCK_SIZE = 16
TOKENIZER = web.AppKey("tokenizer", PromptTokenizer)
TOKEN_ID = 97  # "a" in the demo tokenizer
ANY_TOKEN_ID = SamplingBounds(vocab_size=2**32)
_HEARTBEAT_S = 5.0


def _identity(tokenizer_digest: str, worker_id: str, epoch: str, weights_digest: str
              ) -> dict[str, object]:
    namespace = CacheNamespace(model_id="instant-upstream", weights_digest=weights_digest,
                               tokenizer_digest=tokenizer_digest, block_size=BLOCK_SIZE)
    return {"ready": True, "worker_id": worker_id, "epoch": epoch, "model": "demo",
            "namespace": namespace.to_dict(), "tokenizer_digest": tokenizer_digest,
            "block_size": BLOCK_SIZE, "kv_dtype": "float32", "num_free_blocks": 1,
            "num_total_blocks": 1, "max_model_len": 1 << 20}


def status_routes(worker_id: str = "instant", tokenizer_digest: str | None = None,
                  weights_digest: str = "none") -> list[web.RouteDef]:
    """``/health``, ``/ready``, ``/info`` and ``/kv/events`` of a ready, idle worker whose
    identity matches a router model using the tokenizer of ``tokenizer_digest`` (the
    demo tokenizer's by default) with ``block_size = 16``, its namespace naming
    ``weights_digest`` (the events stream is an empty snapshot, then heartbeats)."""
    digest = tokenizer_digest or PromptTokenizer.demo().digest
    identity = _identity(digest, worker_id, uuid.uuid4().hex, weights_digest)
    zero_load = {"num_requests_running": 0, "num_requests_waiting": 0,
                 "num_waiting_tokens": 0, "kv_cache_usage_ratio": 0.0}

    async def ready(request: web.Request) -> web.Response:
        return web.json_response(identity)

    async def info(request: web.Request) -> web.Response:
        return web.json_response({**identity, "load": zero_load})

    async def events(request: web.Request) -> web.StreamResponse:
        out = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await out.prepare(request)
        cleared = {"worker": worker_id, "epoch": identity["epoch"], "seq": 0,
                   "type": "cleared", "namespace": "00", "scope": "public", "blocks": []}
        try:
            await out.write(json.dumps(cleared).encode() + b"\n")
            while True:
                await asyncio.sleep(_HEARTBEAT_S)
                await out.write(b"\n")
        except ConnectionResetError:  # the router went away
            return out

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    return [web.get("/health", health), web.get("/ready", ready), web.get("/info", info),
            web.get("/kv/events", events)]


async def generate(request: web.Request) -> web.StreamResponse:
    """``POST /generate`` (``radix.generate``, parsed as a worker parses it):
    ``max_tokens`` (default 16) tokens of "a" at once."""
    call, token_ids = GenerateRequest.parse(Fields(await request.json()), ANY_TOKEN_ID,
                                            block_size=1)
    num_tokens = call.sampling.max_tokens or 16
    usage = TokenUsage(len(token_ids), num_tokens, 0)
    steps = [Step(0, [TOKEN_ID], "a", "length" if i == num_tokens - 1 else None)
             for i in range(num_tokens)]
    if call.render is not None:
        answer = RenderedAnswer(call.render)
        return await _stream(request, [*(answer.step(*step) for step in steps),
                                       answer.end(usage)])
    if not call.stream:
        return web.json_response(whole_answer("x", [
            Step(0, [TOKEN_ID] * num_tokens, "a" * num_tokens, "length")], usage))
    return await _stream(request, [*(step_event("x", step) for step in steps),
                                   usage_event("x", usage)])


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models``: one model, ``demo``."""
    return web.json_response({"object": "list", "data": [{"id": "demo", "object": "model"}]})


def openai_handler(endpoint: str, delay_s: float = 0.0, meter: ReuseMeter | None = None
                   ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """``POST /v1/completions`` or ``/v1/chat/completions`` (what sglang-router forwards
    chat requests to): ``max_tokens`` (default 16) tokens of "a" in the endpoint's
    shape, ``delay_s`` after the request arrives; the prompt (token ids, or text in the
    app's tokenizer) is counted by ``meter`` when one is given."""
    async def answer(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = body.get("prompt", "")
        token_ids = prompt if isinstance(prompt, list) else None
        if meter is not None:
            meter.observe(token_ids if token_ids is not None
                          else request.app[TOKENIZER].encode(prompt))
        if delay_s:
            await asyncio.sleep(delay_s)
        num_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 16)
        shape = ResponseShape(endpoint, "demo")
        usage = TokenUsage(len(token_ids) if token_ids is not None else 1, num_tokens, 0)
        if not body.get("stream"):
            return web.json_response(
                shape.whole([ChoiceText(0, "a" * num_tokens, "length")], usage))
        return await _stream(request, [
            *(shape.chunk(0, "a", "length" if i == num_tokens - 1 else None)
              for i in range(num_tokens)), shape.usage_chunk(usage)])
    return answer


completions = openai_handler(COMPLETIONS)


def reuse_routes(meter: ReuseMeter) -> list[web.RouteDef]:
    """``GET /reuse`` (``meter``'s counts) and ``POST /reuse/reset`` (clears them)."""
    async def stats(request: web.Request) -> web.Response:
        return web.json_response(meter.stats().to_dict())

    async def reset(request: web.Request) -> web.Response:
        meter.reset()
        return web.json_response({"reset": True})
    return [web.get("/reuse", stats), web.post("/reuse/reset", reset)]


_SERVER_INFO = {"model_path": "demo", "served_model_name": "demo", "tokenizer_path": "demo",
                "is_generation": True, "max_model_len": 1 << 20, "context_length": 1 << 20}


async def server_info(request: web.Request) -> web.Response:
    """``GET /server_info`` and ``/model_info`` (sglang-router's registration probes)."""
    return web.json_response(_SERVER_INFO)


async def tokenize(request: web.Request) -> web.Response:
    """``POST /tokenize`` (vLLM's shape): the tokenizer's ids of ``prompt``."""
    token_ids = request.app[TOKENIZER].encode((await request.json()).get("prompt", ""))
    return web.json_response({"count": len(token_ids), "max_model_len": 1 << 20,
                              "tokens": token_ids, "token_strs": None})


async def render(request: web.Request) -> web.Response:
    """``POST /v1/completions/render`` and ``/v1/chat/completions/render`` (vllm-router,
    per request): the prompt's ids (chat messages rendered with the template)."""
    body = await request.json()
    tokenizer = request.app[TOKENIZER]
    prompt = body.get("prompt", "")
    if "messages" in body:
        token_ids = encode_messages(tokenizer, body["messages"])
    else:
        token_ids = prompt if isinstance(prompt, list) else tokenizer.encode(prompt)
    return web.json_response([{"request_id": "render", "model": "demo", "token_ids": token_ids}])


def create_app(worker_id: str = "instant", tokenizer: PromptTokenizer | None = None,
               delay_s: float = 0.0, meter: ReuseMeter | None = None,
               weights_digest: str = "none") -> web.Application:
    """The whole stand-in for ``tokenizer`` (the demo tokenizer by default): status
    routes (``weights_digest`` in its namespace), ``/generate``, ``/v1/models``, the OpenAI routes (see ``openai_handler``),
    the peer routers' probes, and the reuse routes when ``meter`` is given."""
    app = web.Application(client_max_size=64 * 2**20)
    app[TOKENIZER] = tokenizer or PromptTokenizer.demo()
    app.add_routes([*status_routes(worker_id, app[TOKENIZER].digest, weights_digest),
                    web.post("/generate", generate), web.get("/v1/models", models),
                    web.post("/v1/completions", openai_handler(COMPLETIONS, delay_s, meter)),
                    web.post("/v1/chat/completions", openai_handler(CHAT, delay_s, meter)),
                    web.post("/v1/chat/completions/render", render),
                    *(reuse_routes(meter) if meter is not None else ()),
                    *(web.get(path, server_info) for path in (
                        "/server_info", "/get_server_info", "/model_info", "/get_model_info")),
                    web.post("/tokenize", tokenize), web.post("/v1/completions/render", render)])
    return app


async def _stream(request: web.Request, events: list[dict[str, object] | bytes]
                  ) -> web.StreamResponse:
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await out.prepare(request)
    for event in events:
        await out.write(event if isinstance(event, bytes)
                        else b"data: " + json.dumps(event).encode() + b"\n\n")
    await out.write(b"data: [DONE]\n\n")
    return out


async def _serve(host: str, port: int, tokenizer: str, delay_s: float,
                 lru_tokens: int | None) -> None:
    meter = ReuseMeter(lru_tokens) if lru_tokens is not None else None
    app = create_app(tokenizer=load_tokenizer(tokenizer), delay_s=delay_s, meter=meter)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = bind_socket(host, port)
    await web.SockSite(runner, sock).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    print(f"READY http://{host}:{sock.getsockname()[1]}", flush=True)
    await stop.wait()
    await runner.cleanup()


def main() -> None:
    """Serve the stand-in until SIGINT/SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--tokenizer", default=DEMO_MODEL,
                        help="the tokenizer the identity names (radix.model_source)")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="before a completion answers")
    parser.add_argument("--lru-tokens", type=int, default=None,
                        help="record prompt reuse, the capped tree holding this many tokens")
    args = parser.parse_args()
    asyncio.run(_serve(args.host, args.port, args.tokenizer, args.delay_ms / 1e3,
                       args.lru_tokens))


if __name__ == "__main__":
    main()
