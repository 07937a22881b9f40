"""LoRA adapters over HTTP, in vLLM's shapes: ``POST /v1/load_lora_adapter`` and
``POST /v1/unload_lora_adapter`` (``{"lora_name", "lora_path"}``), and the lookup
the request routes share (``adapter_for``: a model name to its adapter).

The two run-time routes need the worker's key (the auth middleware) and exist only
with ``--allow-runtime-lora-updates``: without it they answer 404, as vLLM's do when
runtime updating is off. An adapter is read and checked off the event loop, before
anything touches a slot; a refusal is a 400 naming the field. Loading registers the
adapter (it enters a slot when a request first needs it); unloading hides it from new
requests at once, while requests already queued run to their end.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from radix.api_errors import ApiError
from workers.lora.peft_files import AdapterError
from workers.server.errors import bad_request
from workers.server.state import STATE, ServerState, read_fields

MAX_NAME_LEN = 256


def adapter_names(state: ServerState) -> tuple[str, ...]:
    """The adapters requests may name now."""
    return tuple(info.name for info in state.worker.lora.slots.published)


def _runtime_updates(state: ServerState) -> None:
    if not state.worker.lora.settings.allow_runtime_updates:
        raise ApiError(404, "runtime LoRA updates are off on this worker "
                       "(--allow-runtime-lora-updates)", code="not_found")


async def load_lora_adapter(request: web.Request) -> web.Response:
    """``POST /v1/load_lora_adapter``: register the adapter at ``lora_path``."""
    state = request.app[STATE]
    _runtime_updates(state)
    fields = await read_fields(request)
    name = fields.string("lora_name", None, MAX_NAME_LEN)
    path = fields.string("lora_path", None, 4096)
    if not name:
        raise bad_request("lora_name is required", "lora_name")
    if not path:
        raise bad_request("lora_path is required", "lora_path")
    if name in state.identity.served_model_names:
        raise bad_request(f"{name!r} is the base model's name", "lora_name")
    lora = state.worker.lora
    try:
        spec = await asyncio.get_running_loop().run_in_executor(None, lora.read_runtime, name,
                                                                path)
        await state.engine.call(lambda engine: engine.adapters.register(spec))
    except AdapterError as exc:
        raise bad_request(str(exc), exc.param) from None
    return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(request: web.Request) -> web.Response:
    """``POST /v1/unload_lora_adapter``: stop serving ``lora_name`` (404 if unknown)."""
    state = request.app[STATE]
    _runtime_updates(state)
    fields = await read_fields(request)
    name = fields.string("lora_name", None, MAX_NAME_LEN)
    if not name:
        raise bad_request("lora_name is required", "lora_name")
    try:
        await state.engine.call(lambda engine: engine.adapters.unregister(name))
    except KeyError:
        raise ApiError(404, f"the LoRA adapter {name!r} cannot be found", param="lora_name",
                       code="model_not_found") from None
    return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")


def add_routes(app: web.Application) -> None:
    """Register the two run-time routes."""
    app.router.add_post("/v1/load_lora_adapter", load_lora_adapter)
    app.router.add_post("/v1/unload_lora_adapter", unload_lora_adapter)
