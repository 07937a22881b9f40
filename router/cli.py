"""``radix-router`` / ``python -m router``: run the router, a local cluster, or helpers.

Subcommands: ``up`` (the workers, routers and Redis a config launches, as children),
``router`` (the router alone; also what ``python -m router --config F`` runs),
``worker`` (exec ``python -m workers ...``), ``bench`` (exec ``python -m bench ...``),
``hash-key KEY`` (the digest to put in a config for an API key).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from radix.config_flags import add_flags, flag_values, with_values
from radix.namespace import load_secret
from router.config import DEFAULT_CONFIG, RouterConfig, worker_url_problem
from router.config_toml import load_config
from router.front.auth import hash_key

log = logging.getLogger(__name__)
SUBCOMMANDS = ("up", "router", "worker", "bench", "hash-key")
_EXEC_MODULES = {"worker": "workers", "bench": "bench"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radix-router", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the configured workers and a router")
    up.add_argument("--config", default=str(DEFAULT_CONFIG))
    up.add_argument("--port", type=int, help="override the router's listen.port")
    up.add_argument("--metrics-port", type=int, help="override the router's metrics.port")
    router = sub.add_parser("router", help="run the router alone (flags override the "
                                           "config's fields)")
    router.add_argument("--config", default=str(DEFAULT_CONFIG))
    router.add_argument("--worker-url", action="append", default=[], metavar="ID=URL",
                        help="set the URL of configured worker ID (repeatable)")
    router.add_argument("--processes", type=int, default=1,
                        help="router processes sharing the port (SO_REUSEPORT)")
    router.add_argument("--log-level", default="INFO")
    add_flags(router, RouterConfig)
    hashing = sub.add_parser("hash-key", help="print the config digest of an API key")
    hashing.add_argument("key")
    for name, module in _EXEC_MODULES.items():
        sub.add_parser(name, help=f"run python -m {module} with the remaining arguments")
    return parser


def with_flags(config: RouterConfig, args: argparse.Namespace) -> RouterConfig:
    """``config`` with the ``router`` command's flags in ``args``: every config-field
    flag (``radix.config_flags``; ``--redis-url`` also turns ``redis.launch`` off, as
    ``up`` passes the URL of the server it launched, and ``--service-discovery-port``
    replaces ``discovery.port_name``), then ``--worker-url``, and the Redis URL from
    ``redis.url_env``'s variable. ValueError naming the field or flag at fault."""
    values = flag_values(args, RouterConfig)
    if "url" in values.get("redis", {}):
        values["redis"]["launch"] = False
    if "port" in values.get("discovery", {}):
        values["discovery"]["port_name"] = None
    config = _with_worker_urls(with_values(config, values), args.worker_url)
    return replace(config, redis=config.redis.with_url_from_env(os.environ))


def _with_worker_urls(config: RouterConfig, worker_urls: Sequence[str]) -> RouterConfig:
    """``config`` with the URLs of ``--worker-url ID=URL`` items set on its configured
    workers; ValueError naming ``--worker-url`` on a bad item or an unknown id."""
    urls = {}
    for item in worker_urls:
        worker_id, sep, url = item.partition("=")
        if not sep:
            raise ValueError(f"--worker-url: expected ID=http://HOST:PORT, got {item!r}")
        if problem := worker_url_problem(url):
            raise ValueError(f"--worker-url: {problem}")
        urls[worker_id] = url
    unknown = set(urls) - {w.worker_id for w in config.workers}
    if unknown:
        raise ValueError(f"--worker-url: no configured worker {sorted(unknown)[0]!r}")
    workers = tuple(dataclasses.replace(w, url=urls.get(w.worker_id, w.url))
                    for w in config.workers)
    return dataclasses.replace(config, workers=workers)


def limits_for_processes(config: RouterConfig, num_processes: int) -> RouterConfig:
    """``config`` for one of ``num_processes`` router processes: unchanged when they
    share state in Redis (limits are exact across them), else every tenant's
    concurrency and token limits cut to a 1/N share (``AuthConfig.shared_by``), said
    in the log."""
    if num_processes == 1 or config.redis.enabled:
        return config
    log.warning("no [redis] configured: each of the %d router processes enforces 1/%d of "
                "every tenant's concurrency and tokens-per-minute limits (at least 1)",
                num_processes, num_processes)
    return dataclasses.replace(config, auth=config.auth.shared_by(num_processes))


def router_secret(config: RouterConfig) -> bytes:
    """The deployment secret from ``config.secret`` (file, then environment variable,
    then $RADIX_ROUTER_SECRET, else a random dev secret with a warning)."""
    if config.secret.file is not None:
        try:
            return Path(config.secret.file).read_text(encoding="utf-8").strip().encode()
        except OSError as exc:
            raise ValueError(f"secret.file: cannot read {config.secret.file}: {exc}") from exc
    return load_secret(os.environ.get(config.secret.env))


def _run_router(args: argparse.Namespace) -> int:
    # Hugging Face tokenizers split a batch over a thread pool; a router tokenizes one
    # prompt's chunks at a time on a busy machine, where waiting on those threads
    # costs more than it saves (docs/router.md, "Performance"). Set before first use.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from router.server.serve import serve_processes

    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.processes < 1:
        raise ValueError("--processes: must be at least 1")
    config = limits_for_processes(with_flags(load_config(args.config), args), args.processes)
    serve_processes(config, router_secret(config), args.processes)
    return 0


def _run_up(args: argparse.Namespace) -> int:
    from router.up.cluster import run_cluster

    return run_cluster(load_config(args.config), args.config, args.port, args.metrics_port)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (2 for a config error)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in _EXEC_MODULES:
        module = _EXEC_MODULES[args[0]]
        os.execv(sys.executable, [sys.executable, "-m", module, *args[1:]])
    if not args or args[0] not in SUBCOMMANDS and args[0] not in ("-h", "--help"):
        args.insert(0, "router")
    parsed = _parser().parse_args(args)
    if parsed.command == "hash-key":
        print(hash_key(parsed.key))
        return 0
    try:
        return _run_up(parsed) if parsed.command == "up" else _run_router(parsed)
    except (ValueError, RuntimeError) as exc:
        print(f"radix-router: {exc}", file=sys.stderr)
        return 2
