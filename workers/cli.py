"""The ``worker`` command line: ``python -m workers [flags]``.

Configuration comes from ``--config FILE`` (TOML, see configs/worker.toml) with
flags overriding single fields. Bad values exit with status 2 and a message naming
the field. Once the self-test passed the process prints exactly one line
``READY http://HOST:PORT`` on stdout; logs go to stderr. The deployment secret
comes from ``$RADIX_ROUTER_SECRET`` (``radix.namespace.load_secret``); the worker's
API key from ``server.api_key_file`` or ``$RADIX_WORKER_API_KEY``, never from a flag
(see ``workers.server.access``). A keyless worker asked to listen off loopback
exits with status 2 and a one-line error.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

from radix.namespace import load_secret
from workers.config import (
    DEVICES,
    KV_CACHE_DTYPES,
    KV_TRANSFER_FALLBACKS,
    PREEMPTION_MODES,
    WorkerConfig,
    load_config,
    parse_kv_transfer_config,
)
from workers.kv.plan import parse_bytes
from workers.server.access import check_listen_address, load_api_key

# flag destination -> (config section, field)
_FLAG_FIELDS = {
    "model": ("model", "name"),
    "served_model_name": ("model", "served_model_names"),
    "device": ("model", "device"),
    "max_model_len": ("model", "max_model_len"),
    "num_threads": ("model", "num_threads"),
    "time_scale": ("model", "time_scale"),
    "enforce_eager": ("model", "enforce_eager"),
    "host": ("server", "host"),
    "port": ("server", "port"),
    "worker_id": ("server", "worker_id"),
    "self_test_delay_s": ("server", "self_test_delay_s"),
    "drain_timeout_s": ("server", "drain_timeout_s"),
    "kv_cache_bytes": ("kv", "cache_bytes"),
    "gpu_memory_utilization": ("kv", "gpu_memory_utilization"),
    "kv_watermark": ("kv", "watermark"),
    "host_ttl_s": ("kv", "host_ttl_s"),
    "block_size": ("kv", "block_size"),
    "prefix_cache": ("kv", "prefix_cache"),
    "kv_cache_dtype": ("kv", "cache_dtype"),
    "kv_scales": ("kv", "scales_file"),
    "host_cache_bytes": ("kv", "host_cache_bytes"),
    "disk_cache_dir": ("kv", "disk_cache_dir"),
    "disk_cache_bytes": ("kv", "disk_cache_bytes"),
    "preemption_mode": ("engine", "preemption_mode"),
    "max_batched_tokens": ("engine", "max_batched_tokens"),
    "max_num_seqs": ("engine", "max_num_seqs"),
    "max_waiting_requests": ("engine", "max_waiting_requests"),
    "enable_lora": ("lora", "enable"),
    "lora_modules": ("lora", "modules"),
    "max_loras": ("lora", "max_loras"),
    "max_lora_rank": ("lora", "max_lora_rank"),
    "allow_runtime_lora_updates": ("lora", "allow_runtime_updates"),
    "lora_root": ("lora", "roots"),
    "kv_transfer_timeout_s": ("kv_transfer", "timeout_s"),
    "kv_transfer_fallback": ("kv_transfer", "fallback"),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workers", description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--config", help="TOML config file (flags override its values)")
    add("--model", help="'demo', 'SmolLM2-135M-Instruct' (packaged), a GGUF file or a local "
                        "Hugging Face model directory")
    add("--served-model-name", nargs="+", metavar="NAME",
        help="names clients send as 'model' (the first is used in responses; default: --model "
             "exactly as given)")
    add("--device", choices=DEVICES)
    add("--max-model-len", type=int, help="cap on prompt + output tokens")
    add("--num-threads", type=int, help="torch CPU threads (default: torch's choice)")
    add("--time-scale", type=float,
        help="timed models only: every wait this many times longer (default 1)")
    add("--enforce-eager", action="store_const", const=True,
        help="CUDA: run decode steps eagerly, without capturing them in CUDA graphs")
    add("--host", help="address to listen on (default 127.0.0.1)")
    add("--port", type=int, help="port to listen on; 0 picks a free one")
    add("--worker-id", help="id in KV events and /ready (default HOST:PORT)")
    add("--self-test-delay-s", type=float, help="hold /ready at 503 this long before the self-test")
    add("--drain-timeout-s", type=float,
        help="on SIGTERM, how long requests in flight may take to finish (default 30)")
    add("--kv-cache-bytes", type=parse_bytes,
        help="KV cache budget, e.g. 64MiB or 2GiB (default: 256MiB on the CPU; on CUDA, "
             "--gpu-memory-utilization)")
    add("--gpu-memory-utilization", type=float, metavar="F",
        help="CUDA without --kv-cache-bytes: KV gets F x total GPU memory - weights - peak "
             "activation of one max-batched-tokens forward (default 0.9)")
    add("--kv-watermark", type=float, metavar="FRACTION",
        help="share of KV blocks admission leaves free for running sequences to grow "
             "(default 0.01)")
    add("--host-ttl-s", type=float,
        help="drop host-tier KV entries this many seconds after they arrive (default: never)")
    add("--block-size", type=int, help="tokens per KV block (default 16)")
    add("--kv-cache-dtype", choices=KV_CACHE_DTYPES,
        help="KV cache dtype (auto: the model's dtype)")
    add("--kv-scales", metavar="FILE",
        help="per-layer FP8 K/V scales from python -m workers.model.calibrate (default: 1.0)")
    add("--host-cache-bytes", type=parse_bytes,
        help="host-memory KV tier, e.g. 4GiB (default 0: off; evicted blocks are dropped)")
    add("--disk-cache-dir", metavar="DIR",
        help="directory of the disk KV tier below the host tier (kept across restarts)")
    add("--disk-cache-bytes", type=parse_bytes,
        help="disk KV tier size, e.g. 64GiB (default 0: off; needs --disk-cache-dir)")
    add("--preemption-mode", choices=PREEMPTION_MODES,
        help="preempted sequences: recompute later, swap to the host tier, or by length")
    add("--no-prefix-cache", dest="prefix_cache", action="store_const", const=False,
        help="use the null prefix cache (nothing shared; for comparisons)")
    add("--max-batched-tokens", type=int, help="tokens computed per engine step")
    add("--max-num-seqs", type=int, help="sequences running at once")
    add("--max-waiting-requests", type=int, help="queue bound; beyond it requests get 429")
    add("--enable-lora", action="store_const", const=True, help="serve LoRA adapters")
    add("--lora-modules", nargs="+", metavar="NAME=PATH",
        help="adapters to register at start: NAME=PATH or vLLM's JSON form "
             "'{\"name\": ..., \"path\": ..., \"base_model_name\": ...}'")
    add("--max-loras", type=int, help="adapters resident in slots at once (default 1)")
    add("--max-lora-rank", type=int, help="largest adapter rank; slots are this size (default 16)")
    add("--allow-runtime-lora-updates", action="store_const", const=True,
        help="allow POST /v1/load_lora_adapter and /v1/unload_lora_adapter")
    add("--lora-root", nargs="+", metavar="DIR",
        help="the directories run-time adapter loads may read from (one or more)")
    add("--kv-transfer-config", metavar="JSON",
        help="prefill/decode role, vLLM's form: '{\"kv_role\": \"kv_producer\" | "
             "\"kv_consumer\" | \"kv_both\", \"kv_port\": PORT}' (docs/pd.md)")
    add("--kv-transfer-timeout-s", type=float,
        help="a producer holds a request's blocks this long for its consumer (default 480)")
    add("--kv-transfer-fallback", choices=KV_TRANSFER_FALLBACKS,
        help="a consumer whose pull failed: fail the request (503) or recompute")
    add("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    return parser


def config_from_args(args: argparse.Namespace) -> WorkerConfig:
    """The config file (or defaults) with every given flag applied; ValueError naming
    the field on a bad value."""
    overrides: dict[str, dict[str, Any]] = {}
    for dest, (section, name) in _FLAG_FIELDS.items():
        value = getattr(args, dest)
        if value is not None:
            overrides.setdefault(section, {})[name] = value
    if args.kv_transfer_config is not None:
        overrides.setdefault("kv_transfer", {}).update(
            parse_kv_transfer_config(args.kv_transfer_config))
    return load_config(args.config).with_overrides(overrides)


def main(argv: list[str] | None = None) -> int:
    """Run a worker until SIGTERM/SIGINT; returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    logging.basicConfig(
        level=args.log_level, stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    log = logging.getLogger("workers")
    try:
        api_key = load_api_key(config.server)
        check_listen_address(config.server.host, api_key)
    except ValueError as exc:
        log.error("cannot start: %s", exc)
        return 2
    from workers.engine.selftest import SelfTestError  # after logging: these import torch
    from workers.server.serve import serve

    def announce(line: str) -> None:
        print(line, flush=True)

    try:
        asyncio.run(serve(config, load_secret(), api_key, announce))
    except (ValueError, SelfTestError) as exc:
        log.error("cannot start: %s", exc)
        return 1
    return 0
