"""Who may call a worker: its API key, and where it may listen without one.

The key comes from the file named in ``server.api_key_file``, else from
``$RADIX_WORKER_API_KEY``; never from the command line (``ps`` shows every
process's argv). With a key, every route but ``/health`` needs
``Authorization: Bearer <key>`` (``workers.server.app``). Without one the worker
listens on loopback only and warns: ``/generate`` trusts the ``scope`` it is given
and ``/kv/events`` carries every tenant's token ids, so a keyless worker must be
reachable from this machine alone. Asked to listen anywhere else without a key, it
refuses to start.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from workers.config import ServerConfig

WORKER_KEY_ENV = "RADIX_WORKER_API_KEY"
log = logging.getLogger(__name__)


def load_api_key(config: ServerConfig, environ: Mapping[str, str] = os.environ) -> str | None:
    """The worker's key: the stripped contents of ``config.api_key_file`` if set, else
    ``$RADIX_WORKER_API_KEY``, else None. ValueError naming the field when the file
    cannot be read or is empty."""
    if config.api_key_file is not None:
        try:
            key = Path(config.api_key_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ValueError(f"server.api_key_file: cannot read {config.api_key_file}: "
                             f"{exc.strerror}") from exc
        if not key:
            raise ValueError(f"server.api_key_file: {config.api_key_file} is empty")
        return key
    return environ.get(WORKER_KEY_ENV) or None


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen_address(host: str, api_key: str | None) -> None:
    """Allow any address with a key and loopback without one (with a warning);
    ValueError for a keyless worker asked to listen on ``host`` off loopback."""
    if api_key is not None:
        return
    if not is_loopback(host):
        raise ValueError(f"server.host {host!r} is not loopback and no worker API key is set "
                         f"(set ${WORKER_KEY_ENV} or server.api_key_file)")
    log.warning("no worker API key ($%s or server.api_key_file): listening on loopback only; "
                "any local process may call /generate and /kv/events", WORKER_KEY_ENV)
