"""Worker probes: one readiness-and-load check of a worker, as a frozen ``ProbeResult``.

``radix`` workers: ``GET /ready`` (identity, namespace fields, tokenizer digest, LoRA
adapters) then ``GET /info`` (live load). The router computes the namespace digest
itself from the reported CacheNamespace fields under its own secret (an adapter's:
the base fields with the adapter's name and weights digest), and refuses a worker
whose tokenizer digest or block size differs from the router's model.

``openai`` and ``vllm`` workers: ``GET /v1/models`` (ready when it lists a model; a
server without that route is ready when ``GET /health`` answers 200; the models it
lists with a ``parent`` are its LoRA adapters) and
``GET /metrics`` when it exists (Prometheus text; our names and vLLM/SGLang names;
vLLM's ``cache_config_info`` and SGLang's ``page_size`` also give the KV block size);
without metrics the router relies on its own in-flight counts.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from radix.namespace import CacheNamespace
from router.fleet.expectations import Mismatch, Reported, describe, mismatches
from router.models import ModelTokenizer
from router.routing.adapters import WorkerAdapter
from router.routing.index import NamespaceDigest

# /ready, /info, /metrics and /v1/models answers are kilobytes; a vLLM server's
# /metrics with many LoRA adapters tens of kilobytes.
MAX_PROBE_BYTES = 4 << 20

@dataclass(frozen=True)
class WorkerLoad:
    """Load a worker reported at its last poll (zeros when it reports none), the most
    requests it admits at once (running plus queued; None when it does not say),
    beyond which it answers 429, and of those the most it runs at once (its batch
    slots, ``max_num_seqs``); for a prefill worker, the KV blocks it holds for
    consumers and its cap on them (0: no cap reported), at which it refuses legs."""

    num_requests_running: int = 0
    num_requests_waiting: int = 0
    num_waiting_tokens: int = 0
    kv_cache_usage_ratio: float = 0.0
    max_num_requests: int | None = None
    max_num_running: int | None = None
    num_held_blocks: int = 0
    max_held_blocks: int = 0


@dataclass(frozen=True)
class ProbeResult:
    """Outcome of one probe. ``reason`` says why a worker is not ready; ``namespace`` is
    the router-side digest, ``worker_namespace`` the worker's own (its KV events carry
    it); ``served_model`` the model id the worker answers to. ``adapters`` are the
    LoRA adapters it registered, ``max_loras`` its adapter slots (0: LoRA off),
    ``lora_load_ms`` its mean measured adapter load time (None before any load) and
    ``transfer_endpoint`` the (host, port) its KV producer serves blocks on (None when
    it reports none: not a ``kv_producer``); ``transfer_info`` its whole ``/info``
    ``kv_transfer`` object (whether it pulls, its KV costs: read by
    ``router.sources``; None without one); ``cache_namespace`` the fields of the
    worker's base namespace (None for a kind whose namespace the router builds);
    ``mismatches`` the model's expectations it does not meet
    (``router.fleet.expectations``: then it is not ready)."""

    ready: bool
    reason: str
    namespace: str | None = None
    epoch: str | None = None
    served_model: str | None = None
    load: WorkerLoad = WorkerLoad()
    cache_block_size: int | None = None
    worker_namespace: str | None = None
    adapters: tuple[WorkerAdapter, ...] = ()
    max_loras: int = 0
    lora_load_ms: float | None = None
    transfer_endpoint: tuple[str, int] | None = None
    cache_namespace: CacheNamespace | None = None
    transfer_info: Mapping[str, Any] | None = None
    mismatches: tuple[Mismatch, ...] = ()


def _unexpected(model: ModelTokenizer, reported: Reported) -> ProbeResult | None:
    """The not-ready result of a worker that does not meet ``model``'s expectations."""
    found = mismatches(model.expect, reported)
    return ProbeResult(False, describe(model.name, found), mismatches=found) if found else None


class ProbeError(Exception):
    """A probe request failed or answered something unusable."""


async def read_at_most(resp: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """``resp``'s body, or None as soon as it passes ``limit`` bytes (what a worker
    answers is never buffered past what the router expects of it)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def _get(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str],
               timeout_s: float) -> tuple[int, str]:
    try:
        async with session.get(url, headers=headers,
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            raw = await read_at_most(resp, MAX_PROBE_BYTES)
            if raw is None:
                raise ProbeError(f"GET {url}: HTTP {resp.status}, an answer over "
                                 f"{MAX_PROBE_BYTES} bytes")
            return resp.status, raw.decode(errors="replace")
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ProbeError(f"GET {url}: {type(exc).__name__}: {exc}") from exc


async def _get_json(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str],
                    timeout_s: float) -> tuple[int, Any]:
    status, text = await _get(session, url, headers, timeout_s)
    try:
        return status, json.loads(text)
    except ValueError as exc:
        raise ProbeError(f"GET {url}: HTTP {status}, not JSON") from exc


async def probe_radix(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str],
                      timeout_s: float, model: ModelTokenizer, secret: bytes) -> ProbeResult:
    """Readiness, identity and load of one of our workers."""
    try:
        status, ready = await _get_json(session, f"{url}/ready", headers, timeout_s)
        if status != 200 or not isinstance(ready, dict) or ready.get("ready") is not True:
            return ProbeResult(False, f"/ready answered HTTP {status}")
        if ready.get("tokenizer_digest") != model.digest:
            return ProbeResult(False, "tokenizer digest differs from the router's "
                               f"{model.name!r} tokenizer")
        if ready.get("block_size") != model.block_size:
            return ProbeResult(False, f"block_size {ready.get('block_size')!r} differs from "
                               f"models.{model.name}.block_size ({model.block_size})")
        try:
            base = CacheNamespace.from_dict(ready["namespace"])
            adapters = radix_adapters(ready.get("adapters", []), base, secret)
            lora = (int(ready.get("max_loras") or 0), _optional_float(ready.get("lora_load_ms")))
        except (KeyError, TypeError, ValueError) as exc:
            return ProbeResult(False, f"/ready has no valid namespace or adapters: {exc}")
        if refused := _unexpected(model, Reported.of(base, ready.get("engine_version"))):
            return refused
        status, info = await _get_json(session, f"{url}/info", headers, timeout_s)
        if status != 200 or not isinstance(info, dict):
            return ProbeResult(False, f"/info answered HTTP {status}")
        return ProbeResult(True, "ready", base.fingerprint(secret), str(ready.get("epoch")),
                           str(ready.get("model")),
                           _radix_load(info.get("load"), info.get("engine")),
                           worker_namespace=_optional_str(ready.get("namespace_digest")),
                           adapters=adapters, max_loras=lora[0], lora_load_ms=lora[1],
                           transfer_endpoint=transfer_endpoint(info.get("kv_transfer")),
                           cache_namespace=base,
                           transfer_info=_optional_dict(info.get("kv_transfer")))
    except ProbeError as exc:
        return ProbeResult(False, str(exc))


def _optional_dict(value: Any) -> Mapping[str, Any] | None:
    return value if isinstance(value, dict) else None


def transfer_endpoint(reported: Any) -> tuple[str, int] | None:
    """``/info``'s ``kv_transfer`` as (host, port); None when absent or malformed, so
    no prefill leg's params can match it."""
    if not isinstance(reported, dict):
        return None
    host, port = reported.get("host"), reported.get("port")
    if (not isinstance(host, str) or not host or not isinstance(port, int)
            or isinstance(port, bool) or not 0 < port < 65536):
        return None
    return host, port


def radix_adapters(listed: Any, base: CacheNamespace, secret: bytes) -> tuple[WorkerAdapter, ...]:
    """``/ready``'s ``adapters`` (name, weights digest, the worker's namespace digest,
    resident), each filed under the router's digest of the base namespace with the
    adapter's name and digest; ValueError (or TypeError, KeyError) when malformed."""
    adapters = []
    for entry in listed:
        name, digest = entry["name"], entry["digest"]
        namespace = dataclasses.replace(base, adapter_name=name, adapter_digest=digest)
        adapters.append(WorkerAdapter(name, NamespaceDigest(namespace.fingerprint(secret)),
                                      str(entry["namespace"]), entry["resident"] is True))
    return tuple(adapters)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _optional_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _radix_load(load: Any, engine: Any) -> WorkerLoad:
    """``/info``'s ``load``, with the admission bound from its ``engine`` limits
    (``max_num_seqs`` running plus ``max_waiting_requests`` queued)."""
    if not isinstance(load, dict):
        return WorkerLoad()
    try:
        max_num_requests = max_num_running = None
        if isinstance(engine, dict) and "max_waiting_requests" in engine:
            max_num_running = int(engine["max_num_seqs"])
            max_num_requests = max_num_running + int(engine["max_waiting_requests"])
        return WorkerLoad(
            num_requests_running=int(load.get("num_requests_running", 0)),
            num_requests_waiting=int(load.get("num_requests_waiting", 0)),
            num_waiting_tokens=int(load.get("num_waiting_tokens", 0)),
            kv_cache_usage_ratio=float(load.get("kv_cache_usage_ratio", 0.0)),
            max_num_requests=max_num_requests,
            max_num_running=max_num_running,
            num_held_blocks=int(load.get("num_held_blocks", 0)),
            max_held_blocks=int(load.get("max_held_blocks", 0)),
        )
    except (KeyError, TypeError, ValueError):
        return WorkerLoad()


def openai_namespace(model: ModelTokenizer, secret: bytes, kind: str = "openai",
                     adapter_name: str = "") -> str:
    """The namespace the router files an OpenAI-compatible (``kind`` ``openai``),
    vLLM or SGLang worker's entries under: it knows only the engine kind, the model, the
    router's tokenizer and, for a LoRA adapter's blocks, the adapter's name (the
    engine publishes no digest of its weights)."""
    return CacheNamespace(
        model_id=f"{kind}:{model.name}",
        weights_digest="unknown",
        tokenizer_digest=model.digest,
        adapter_name=adapter_name,
        adapter_digest="unknown" if adapter_name else "",
        block_size=model.block_size,
    ).fingerprint(secret)


async def probe_openai(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str],
                       timeout_s: float, model: ModelTokenizer, secret: bytes,
                       kind: str = "openai") -> ProbeResult:
    """Readiness (``/v1/models``) and, if published, Prometheus load (and the engine's
    KV block size) of an OpenAI-compatible server of ``kind`` (``openai``, ``vllm`` or
    ``sglang``)."""
    try:
        served, adapter_names = await _served_model(session, url, headers, timeout_s, model.name)
        if served is None:
            return ProbeResult(False, "neither /v1/models nor /health answers")
        if refused := _unexpected(model, Reported()):
            return refused
        status, text = await _get(session, f"{url}/metrics", headers, timeout_s)
        if status != 200:
            text = ""
        adapters = []
        for name in adapter_names:
            namespace = NamespaceDigest(openai_namespace(model, secret, kind, name))
            adapters.append(WorkerAdapter(name, namespace, namespace, True))
        return ProbeResult(True, "ready", openai_namespace(model, secret, kind), None, served,
                           parse_prometheus_load(text), parse_cache_block_size(text),
                           adapters=tuple(adapters))
    except ProbeError as exc:
        return ProbeResult(False, str(exc))


async def _served_model(session: aiohttp.ClientSession, url: str, headers: Mapping[str, str],
                        timeout_s: float, name: str) -> tuple[str | None, list[str]]:
    """The model id to send: ``name`` if ``/v1/models`` lists it, else the first listed
    base model; ``name`` when the server has no ``/v1/models`` but its ``/health``
    answers 200; None when neither answers. With it, the listed LoRA adapters (the
    models with a ``parent``)."""
    status, text = await _get(session, f"{url}/v1/models", headers, timeout_s)
    if status == 200:
        try:
            listed = [m for m in json.loads(text).get("data", [])
                      if isinstance(m, dict) and isinstance(m.get("id"), str)]
        except (ValueError, AttributeError):
            listed = []
        ids = [m["id"] for m in listed if not m.get("parent")]
        if ids:
            return name if name in ids else ids[0], [m["id"] for m in listed if m.get("parent")]
    status, _ = await _get(session, f"{url}/health", headers, timeout_s)
    return (name if status == 200 else None), []


_PROMETHEUS_NAMES = {
    "num_requests_running": ("num_requests_running", "vllm:num_requests_running",
                             "sglang:num_running_reqs"),
    "num_requests_waiting": ("num_requests_waiting", "vllm:num_requests_waiting",
                             "sglang:num_queue_reqs"),
    "num_waiting_tokens": ("num_waiting_tokens",),
    "kv_cache_usage_ratio": ("kv_cache_usage_ratio", "vllm:kv_cache_usage_perc",
                             "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
}


def parse_prometheus_load(text: str) -> WorkerLoad:
    """Load gauges from Prometheus text exposition, summed over label sets; names of
    our worker, vLLM and SGLang are understood, anything else ignored."""
    wanted = {name: field for field, names in _PROMETHEUS_NAMES.items() for name in names}
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition("{") if "{" in line else line.partition(" ")
        field = wanted.get(name.strip())
        if field is None:
            continue
        try:
            value = float(rest.rsplit("}", 1)[-1].split()[0])
        except (IndexError, ValueError):
            continue
        totals[field] = totals.get(field, 0.0) + value
    return WorkerLoad(
        num_requests_running=int(totals.get("num_requests_running", 0)),
        num_requests_waiting=int(totals.get("num_requests_waiting", 0)),
        num_waiting_tokens=int(totals.get("num_waiting_tokens", 0)),
        kv_cache_usage_ratio=totals.get("kv_cache_usage_ratio", 0.0),
    )


_CACHE_CONFIG_INFO = re.compile(r'^vllm:cache_config_info\{[^}]*?\bblock_size="(\d+)"', re.M)
_SGLANG_PAGE_SIZE = re.compile(r"^sglang:page_size(?:\{[^}]*\})? (\d+)(?:\.0*)?$", re.M)


def parse_cache_block_size(text: str) -> int | None:
    """The engine's KV block size: vLLM's from its ``vllm:cache_config_info`` gauge,
    SGLang's page size from its ``sglang:page_size`` gauge (None without either)."""
    found = _CACHE_CONFIG_INFO.search(text) or _SGLANG_PAGE_SIZE.search(text)
    return int(found.group(1)) if found and int(found.group(1)) > 0 else None
