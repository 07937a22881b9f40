"""A stand-in upstream that answers instantly, for measuring the router's own overhead.

This is NOT a worker: it runs no model and caches nothing. With ``--lru-tokens`` it
records prompt reuse (``bench.reuse.ReuseMeter``: the longest prefix of each
completion prompt it had already seen, unlimited and under an LRU cap of that many
tokens; text prompts tokenized with the demo tokenizer, as our router tokenizes
them), served at ``GET /reuse`` and cleared by ``POST /reuse/reset``; with
``--delay-ms`` a completion answers after that delay (the reference harness,
``bench.reference``). It speaks just enough of
the worker HTTP API (docs/protocol.md) for a router to accept and use it: ``/ready``
and ``/info`` report the demo tokenizer's digest and a fixed namespace, ``/kv/events``
sends an empty snapshot and then heartbeats, ``/generate`` returns ``max_tokens``
fixed tokens at once (streamed as one SSE event per token), and the OpenAI routes
answer the same way so it can also stand in for an ``openai``-kind worker, behind our
router or behind the peer routers (``/server_info``, ``/model_info`` for
sglang-router; ``/tokenize`` and ``/v1/completions/render`` with the demo tokenizer
for vllm-router).

``python -m bench.instant_upstream --port 0`` prints ``READY http://HOST:PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import signal
import uuid
from collections.abc import Awaitable, Callable

from aiohttp import web

from bench.reuse import ReuseMeter
from radix.keys import from_key
from radix.namespace import CacheNamespace
from radix.tokenizer import PromptTokenizer
from router.server.app import bind_socket

BLOCK_SIZE = 16
_DEMO = PromptTokenizer.demo()
TOKEN_ID = 97  # "a" in the demo tokenizer
_HEARTBEAT_S = 5.0


def _identity(tokenizer_digest: str, worker_id: str, epoch: str) -> dict[str, object]:
    namespace = CacheNamespace(model_id="instant-upstream", weights_digest="none",
                               tokenizer_digest=tokenizer_digest, block_size=BLOCK_SIZE)
    return {"ready": True, "worker_id": worker_id, "epoch": epoch, "model": "demo",
            "namespace": namespace.to_dict(), "tokenizer_digest": tokenizer_digest,
            "block_size": BLOCK_SIZE, "kv_dtype": "float32", "num_free_blocks": 1,
            "num_total_blocks": 1, "max_model_len": 1 << 20}


def status_routes(worker_id: str = "instant") -> list[web.RouteDef]:
    """``/health``, ``/ready``, ``/info`` and ``/kv/events`` of a ready, idle worker whose
    identity matches a router model using the demo tokenizer with ``block_size = 16``
    (the events stream is an empty snapshot, then heartbeats)."""
    identity = _identity(_DEMO.digest, worker_id, uuid.uuid4().hex)
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
    """``POST /generate``: ``max_tokens`` (default 16) tokens of "a" at once. The
    prompt is ``token_ids`` or ``token_ids_b64`` (decoded, as a worker must)."""
    body = await request.json()
    if "token_ids_b64" in body:
        num_prompt = len(from_key(base64.b64decode(body["token_ids_b64"], validate=True)))
    else:
        num_prompt = len(body["token_ids"])
    num_tokens = int(body.get("sampling", {}).get("max_tokens") or 16)
    usage = {"prompt_tokens": num_prompt, "completion_tokens": num_tokens, "cached_tokens": 0}
    if not body.get("stream"):
        return web.json_response({"request_id": "x", "usage": usage, "choices": [{
            "index": 0, "token_ids": [TOKEN_ID] * num_tokens, "text": "a" * num_tokens,
            "finish_reason": "length"}]})
    return await _stream(request, [
        {"request_id": "x", "index": 0, "token_ids": [TOKEN_ID], "text": "a",
         "finish_reason": "length" if i == num_tokens - 1 else None}
        for i in range(num_tokens)
    ] + [{"request_id": "x", "usage": usage}])


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models``: one model, ``demo``."""
    return web.json_response({"object": "list", "data": [{"id": "demo", "object": "model"}]})


def completions_handler(delay_s: float = 0.0, meter: ReuseMeter | None = None
                        ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """``POST /v1/completions``: ``max_tokens`` (default 16) tokens of "a", ``delay_s``
    after the request arrives; the prompt (token ids, or text in the demo tokenizer)
    is counted by ``meter`` when one is given."""
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = body.get("prompt", "")
        token_ids = prompt if isinstance(prompt, list) else None
        if meter is not None:
            meter.observe(token_ids if token_ids is not None else _DEMO.encode(prompt))
        if delay_s:
            await asyncio.sleep(delay_s)
        num_tokens = int(body.get("max_tokens") or 16)
        num_prompt = len(token_ids) if token_ids is not None else 1
        usage = {"prompt_tokens": num_prompt, "completion_tokens": num_tokens,
                 "total_tokens": num_prompt + num_tokens,
                 "prompt_tokens_details": {"cached_tokens": 0}}
        chunk = {"id": "cmpl-x", "object": "text_completion", "created": 0, "model": "demo"}
        if not body.get("stream"):
            return web.json_response({**chunk, "usage": usage, "choices": [
                {"index": 0, "text": "a" * num_tokens, "finish_reason": "length"}]})
        return await _stream(request, [
            {**chunk, "choices": [{"index": 0, "text": "a", "finish_reason": None}]}
            for _ in range(num_tokens)
        ] + [{**chunk, "choices": [], "usage": usage}])
    return completions


completions = completions_handler()


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
    """``POST /tokenize`` (vLLM's shape): the demo tokenizer's ids of ``prompt``."""
    token_ids = _DEMO.encode((await request.json()).get("prompt", ""))
    return web.json_response({"count": len(token_ids), "max_model_len": 1 << 20,
                              "tokens": token_ids, "token_strs": None})


async def render(request: web.Request) -> web.Response:
    """``POST /v1/completions/render`` (vllm-router, per request): the prompt's ids."""
    body = await request.json()
    prompt = body.get("prompt", "")
    token_ids = prompt if isinstance(prompt, list) else _DEMO.encode(prompt)
    return web.json_response([{"request_id": "render", "model": "demo", "token_ids": token_ids}])


def create_app(worker_id: str = "instant", delay_s: float = 0.0,
               meter: ReuseMeter | None = None) -> web.Application:
    """The whole stand-in: status routes, ``/generate``, ``/v1/models``,
    ``/v1/completions`` (see ``completions_handler``), the peer routers' probes, and
    the reuse routes when ``meter`` is given."""
    app = web.Application(client_max_size=64 * 2**20)
    app.add_routes([*status_routes(worker_id), web.post("/generate", generate),
                    web.get("/v1/models", models), web.post("/v1/completions", completions_handler(delay_s, meter)),
                    *(reuse_routes(meter) if meter is not None else ()),
                    *(web.get(path, server_info) for path in (
                        "/server_info", "/get_server_info", "/model_info", "/get_model_info")),
                    web.post("/tokenize", tokenize), web.post("/v1/completions/render", render)])
    return app


async def _stream(request: web.Request, events: list[dict[str, object]]) -> web.StreamResponse:
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await out.prepare(request)
    for event in events:
        await out.write(b"data: " + json.dumps(event).encode() + b"\n\n")
    await out.write(b"data: [DONE]\n\n")
    return out


async def _serve(host: str, port: int, delay_s: float, lru_tokens: int | None) -> None:
    meter = ReuseMeter(lru_tokens) if lru_tokens is not None else None
    runner = web.AppRunner(create_app(delay_s=delay_s, meter=meter), access_log=None)
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
    parser.add_argument("--delay-ms", type=float, default=0.0, help="before a completion answers")
    parser.add_argument("--lru-tokens", type=int, default=None,
                        help="record prompt reuse, the capped tree holding this many tokens")
    args = parser.parse_args()
    asyncio.run(_serve(args.host, args.port, args.delay_ms / 1e3, args.lru_tokens))


if __name__ == "__main__":
    main()
