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
from pathlib import Path

from radix.namespace import load_secret
from router.config import DEFAULT_CONFIG, RouterConfig, redis_url_problem, worker_url_problem
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
    router = sub.add_parser("router", help="run the router alone")
    router.add_argument("--config", default=str(DEFAULT_CONFIG))
    router.add_argument("--host", help="override listen.host")
    router.add_argument("--port", type=int, help="override listen.port (0: a free port)")
    router.add_argument("--metrics-port", type=int,
                        help="override metrics.port (0: a free port)")
    router.add_argument("--worker-url", action="append", default=[], metavar="ID=URL",
                        help="set the URL of configured worker ID (repeatable)")
    router.add_argument("--processes", type=int, default=1,
                        help="router processes sharing the port (SO_REUSEPORT)")
    router.add_argument("--redis-url", help="override redis.url (shared state)")
    router.add_argument("--log-level", default="INFO")
    found = router.add_argument_group(
        "Kubernetes discovery (sglang-router's flag names; [discovery] in the config)")
    found.add_argument("--service-discovery", action="store_true",
                       help='discover workers from pods (discovery.kind = "kubernetes")')
    found.add_argument("--selector", nargs="+", metavar="KEY=VALUE",
                       help="the pods' labels (discovery.selector)")
    found.add_argument("--service-discovery-namespace", metavar="NS",
                       help="the pods' namespace (discovery.namespace)")
    found.add_argument("--service-discovery-port", type=int, metavar="PORT",
                       help="the port the workers serve on (discovery.port)")
    hashing = sub.add_parser("hash-key", help="print the config digest of an API key")
    hashing.add_argument("key")
    for name, module in _EXEC_MODULES.items():
        sub.add_parser(name, help=f"run python -m {module} with the remaining arguments")
    return parser


def with_overrides(config: RouterConfig, host: str | None, port: int | None,
                   worker_urls: Sequence[str], metrics_port: int | None = None,
                   redis_url: str | None = None) -> RouterConfig:
    """``config`` with command-line overrides; ValueError naming a bad ``--worker-url``
    or ``--redis-url``. A ``redis_url`` replaces ``redis.launch`` (``up`` passes the
    URL of the server it launched)."""
    listen = dataclasses.replace(config.listen, host=host or config.listen.host,
                                 port=config.listen.port if port is None else port)
    metrics = config.metrics if metrics_port is None else dataclasses.replace(
        config.metrics, port=metrics_port)
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
    redis = config.redis
    if redis_url is not None:
        if problem := redis_url_problem(redis_url):
            raise ValueError(f"--redis-url: {problem}")
        redis = dataclasses.replace(redis, url=redis_url, launch=False)
    return dataclasses.replace(config, listen=listen, metrics=metrics, workers=workers,
                               redis=redis)


def with_discovery(config: RouterConfig, enabled: bool, selector: Sequence[str] | None,
                   namespace: str | None, port: int | None) -> RouterConfig:
    """``config`` with sglang-router's discovery flags applied over ``[discovery]``
    (``--service-discovery`` sets ``kind = "kubernetes"``); ValueError naming a bad
    flag."""
    fields: dict[str, object] = {}
    if enabled:
        fields["kind"] = "kubernetes"
    if selector is not None:
        if any("=" not in item for item in selector):
            raise ValueError(f"--selector: expected KEY=VALUE, got {' '.join(selector)!r}")
        fields["selector"] = dict(item.partition("=")[::2] for item in selector)
    if namespace is not None:
        fields["namespace"] = namespace
    if port is not None:
        fields.update(port=port, port_name=None)
    if not fields:
        return config
    table = {**{f.name: getattr(config.discovery, f.name)
                for f in dataclasses.fields(config.discovery)}, **fields}
    try:
        discovery = type(config.discovery)(**table)
    except ValueError as exc:
        raise ValueError(f"--service-discovery: {exc}") from exc
    return dataclasses.replace(config, discovery=discovery)


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
    config = with_overrides(load_config(args.config), args.host, args.port, args.worker_url,
                            args.metrics_port, args.redis_url)
    config = with_discovery(config, args.service_discovery, args.selector,
                            args.service_discovery_namespace, args.service_discovery_port)
    config = limits_for_processes(config, args.processes)
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
