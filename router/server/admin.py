"""Admin routes (admin key required): workers, public prefixes, index statistics,
canary pool weights.

Every change is logged (logger ``router.admin``, INFO) with who made it (the name of
the admin key, the caller's address and the request id), what changed, and when
(the log record's time); every admin request, reads too, at DEBUG. Canary weights
may be set for ``ttl_s`` seconds: they go back by themselves, logged the same way
(``router.canary.overrides``). A worker added here may take its key only from the variable named
for its id (``router.fleet.worker_keys``): otherwise an admin request could have the
router send another worker's key, or the deployment secret, to a host it names.
With several routers sharing Redis, each change is also published to the others
(``router.siblings.protocol``).
"""

from __future__ import annotations

import logging

from aiohttp import web

from radix.api_errors import ApiError
from radix.keys import to_key
from radix.openai.json_body import decode_json_object
from router.canary.overrides import MAX_TTL_S, SetBy
from router.config_toml import parse_public_prefix, parse_worker
from router.context import ROUTER, Router
from router.fleet.worker_keys import runtime_key_problem
from router.server.request_ids import request_id
from router.server.slow_clients import read_body

audit = logging.getLogger("router.admin")
_KEY_NAME = web.RequestKey("admin_key_name", str)


async def _admin(request: web.Request) -> Router:
    router = request.app[ROUTER]
    request[_KEY_NAME] = router.auth.check_admin(request.headers.get("Authorization"))
    audit.debug("admin %s %s by key %s from %s (request %s)", request.method, request.path,
                request[_KEY_NAME], request.remote, request_id(request))
    return router


def _set_by(request: web.Request) -> SetBy:
    return SetBy(request[_KEY_NAME], request_id(request))


def _log_change(request: web.Request, what: str, *args: object) -> None:
    audit.info("admin change by key %s from %s (request %s): " + what, request[_KEY_NAME],
               request.remote, request_id(request), *args)


def _ttl(value: object) -> float | None:
    """An admin change's ``ttl_s``: None (for good) or seconds in (0, ``MAX_TTL_S``];
    ApiError 400 naming ``ttl_s`` otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0 < value <= MAX_TTL_S:
        raise ApiError(400, f"ttl_s must be a number of seconds above 0, at most {MAX_TTL_S:g}",
                       param="ttl_s")
    return float(value)


async def list_workers(request: web.Request) -> web.Response:
    """``GET /admin/workers``: every registered worker with state, load and stats, and
    per model the cache namespaces its ready workers are in (more than one: a split
    pool, ``router.fleet.model_namespaces``)."""
    router = await _admin(request)
    return web.json_response({"workers": [w.to_dict() for w in router.registry.workers()],
                              "models": router.registry.namespaces.to_dict()})


async def change_workers(request: web.Request) -> web.Response:
    """``POST /admin/workers``: ``{"action": "add", "worker": {id, url, model, kind,
    api_key_env}}`` registers a worker (routed once its probe passes);
    ``{"action": "remove", "id": ...}`` removes one and drops its index entries."""
    router = await _admin(request)
    body = decode_json_object(
        await read_body(request, router.config.listen.body_timeout_s))
    action = body.get("action")
    if action == "add":
        worker = body.get("worker")
        if not isinstance(worker, dict):
            raise ApiError(400, "worker must be an object", param="worker")
        prefix = router.config.admin.worker_key_env_prefix
        try:
            config = parse_worker(worker, {n: None for n in router.models.names()}, "worker",
                                  prefix)
            if config.url is None:
                raise ValueError("worker.url: required")
            if problem := runtime_key_problem(config, prefix, router.config.workers):
                raise ValueError(f"worker.{problem}")
            state = router.registry.add(config)
        except ValueError as exc:
            raise ApiError(400, str(exc), param="worker") from exc
        await router.siblings.worker_added(state)
        _log_change(request, "added worker %s (%s, %s, key from %s)", config.worker_id,
                    config.kind, config.url, config.api_key_env or "no key")
        return web.json_response({"added": state.to_dict()})
    if action == "remove":
        worker_id = body.get("id")
        if not isinstance(worker_id, str) or not await router.registry.remove(worker_id):
            raise ApiError(404, f"no worker {worker_id!r}", param="id")
        await router.siblings.worker_removed(worker_id)
        _log_change(request, "removed worker %s", worker_id)
        return web.json_response({"removed": worker_id})
    raise ApiError(400, "action must be 'add' or 'remove'", param="action")


async def add_public_prefix(request: web.Request) -> web.Response:
    """``POST /admin/public-prefixes``: ``{"model", and one of "text", "messages",
    "token_ids"}``. Later requests starting with it share its whole blocks across
    tenants."""
    router = await _admin(request)
    body = decode_json_object(
        await read_body(request, router.config.listen.body_timeout_s))
    model = router.models.get(body.pop("model", None))
    try:
        spec = parse_public_prefix(body, "prefix")
    except ValueError as exc:
        raise ApiError(400, str(exc)) from exc
    token_ids = model.prefix_tokens(spec)
    num_public = model.public_prefixes.add(token_ids)
    await router.siblings.prefix_added(model.name, to_key(token_ids))
    _log_change(request, "registered a public prefix of %d tokens for model %s",
                len(token_ids), model.name)
    return web.json_response({"model": model.name, "num_tokens": len(token_ids),
                              "num_public_tokens": num_public,
                              "num_prefixes": model.public_prefixes.num_prefixes})


async def index_stats(request: web.Request) -> web.Response:
    """``GET /admin/index``: index totals, the exact index's ``fingerprint`` (equal on
    routers that hold the same blocks), and per worker its namespace, the blocks and
    approximate tokens the index holds for it, and hit rates of the requests routed
    to it (cached = what the worker reported; predicted = what the index matched)."""
    router = await _admin(request)
    stats = router.index.stats()
    workers = {
        w.worker_id: {
            "namespace": w.namespace,
            "ready": w.ready,
            "num_blocks": stats.num_blocks.get(w.worker_id, 0),
            "num_approx_tokens": stats.num_approx_tokens.get(w.worker_id, 0),
            **w.stats.to_dict(),
        }
        for w in router.registry.workers()
    }
    return web.json_response({"index": stats.to_dict(), "fingerprint": router.index.fingerprint(),
                              "workers": workers})


async def discovery_state(request: web.Request) -> web.Response:
    """``GET /admin/discovery``: what discovery has seen (``DiscoveryStatus``), or
    ``{"kind": "none"}`` when the router discovers nothing."""
    router = await _admin(request)
    if router.discovery is None:
        return web.json_response({"kind": "none"})
    return web.json_response(router.discovery.status.to_dict())


async def canary_state(request: web.Request) -> web.Response:
    """``GET /admin/canary``: per model with pools, each pool's weight, workers, trip
    and guard window (``router.canary.controller``)."""
    router = await _admin(request)
    return web.json_response({"models": router.canary.to_dict()})


async def set_canary_weights(request: web.Request) -> web.Response:
    """``POST /admin/canary``: ``{"model", "weights": {pool: weight}, "ttl_s"?}`` sets
    the named pools' weights (on every router sharing this one's Redis), with
    ``ttl_s`` for that many seconds only; a weight above 0 re-enables a pool a guard
    tripped. 404 for a model without pools, 400 naming a bad pool, weight or ttl."""
    router = await _admin(request)
    body = decode_json_object(
        await read_body(request, router.config.listen.body_timeout_s))
    model, weights = body.get("model"), body.get("weights")
    if not isinstance(weights, dict) or not weights:
        raise ApiError(400, "weights must be an object of pool: weight", param="weights")
    ttl_s = _ttl(body.get("ttl_s"))
    try:
        now = router.canary.set_weights(model if isinstance(model, str) else "", weights,
                                        _set_by(request), ttl_s)
    except KeyError:
        raise ApiError(404, f"model {model!r} has no canary pools", param="model") from None
    except ValueError as exc:
        raise ApiError(400, str(exc), param="weights") from exc
    await router.siblings.canary_changed(model, router.canary.shared_state(model))
    _log_change(request, "set canary weights of model %s: %s%s", model, dict(now),
                "" if ttl_s is None else f" for {ttl_s:g} s")
    answer = {"model": model, "weights": dict(now)}
    return web.json_response(answer if ttl_s is None else {**answer, "ttl_s": ttl_s})


def add_admin_routes(app: web.Application) -> None:
    """Register the admin routes on ``app``."""
    app.add_routes([
        web.get("/admin/workers", list_workers),
        web.post("/admin/workers", change_workers),
        web.post("/admin/public-prefixes", add_public_prefix),
        web.get("/admin/index", index_stats),
        web.get("/admin/discovery", discovery_state),
        web.get("/admin/canary", canary_state),
        web.post("/admin/canary", set_canary_weights),
    ])
