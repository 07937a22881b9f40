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

from radix.config_flags import add_flags, flag_values, with_values
from radix.namespace import load_secret
from workers.config import WorkerConfig, load_config, parse_kv_transfer_config
from workers.server.access import check_listen_address, load_api_key


def _parser() -> argparse.ArgumentParser:
    """``--config``, one flag per flagged field of ``WorkerConfig`` (``workers.config``),
    ``--kv-transfer-config`` (vLLM's JSON over several fields) and ``--log-level``."""
    parser = argparse.ArgumentParser(prog="python -m workers", description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="TOML config file (flags override its values)")
    parser.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    add_flags(parser, WorkerConfig)["kv_transfer"].add_argument(
        "--kv-transfer-config", metavar="JSON",
        help="prefill/decode role, vLLM's form: '{\"kv_role\": \"kv_producer\" | "
             "\"kv_consumer\" | \"kv_both\", \"kv_port\": PORT}' (docs/pd.md; sets "
             "kv_role, kv_port and, from kv_ip, kv_host)")
    return parser


def config_from_args(args: argparse.Namespace) -> WorkerConfig:
    """The config file (or defaults) with every given flag applied; ValueError naming
    the field on a bad value."""
    values = flag_values(args, WorkerConfig)
    if args.kv_transfer_config is not None:
        values.setdefault("kv_transfer", {}).update(
            parse_kv_transfer_config(args.kv_transfer_config))
    return with_values(load_config(args.config), values)


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
