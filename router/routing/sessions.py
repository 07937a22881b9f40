"""Sessions that return: an agent session's requests go back to the worker that served
its last one while that worker is not saturated (docs/router-index.md, "Sessions that
return").

A request names its session with ``x-session-id`` (or Dynamo's
``x-dynamo-session-id``) and may hint, with ``x-session-retention-s``, how long its
context should outlive it (the tool call it waits on); ``read_session`` checks both.
``SessionTable`` maps (tenant, session) to the worker that last served it, until the
hint (or the default) runs out, at most ``max_entries`` sessions (the least recently
noted go first); a session id is a tenant's own, so one tenant cannot steer another's.
``prefer_session`` puts that worker first among the ranked ones while its active
requests stay below the bounded-load cap, ``ceil(factor * (all active + 1) /
workers)``: sticky until saturated, then the policy's ranking stands (and the source
planner can pull the session's blocks from the worker that holds them).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeVar

from radix.api_errors import bad_request
from router.config import SessionsConfig

SESSION_HEADERS = ("x-session-id", "x-dynamo-session-id")
RETENTION_HEADER = "x-session-retention-s"
MAX_SESSION_ID_CHARS = 256
W = TypeVar("W")


class SessionHint(NamedTuple):
    """A request's session and how long its context should be kept after it (None:
    no hint)."""

    session_id: str
    retention_s: float | None


def read_session(header: Callable[[str], str | None], max_retention_s: float
                 ) -> SessionHint | None:
    """The session a request's headers name (None without one); a retention hint is
    capped at ``max_retention_s``. 400 naming the header when one is malformed."""
    session_id = next((v for name in SESSION_HEADERS if (v := header(name))), None)
    retention = header(RETENTION_HEADER)
    if session_id is None:
        return None
    if len(session_id) > MAX_SESSION_ID_CHARS or not session_id.isprintable():
        raise bad_request(f"{SESSION_HEADERS[0]} must be at most {MAX_SESSION_ID_CHARS} "
                          f"printable characters", SESSION_HEADERS[0])
    if retention is None:
        return SessionHint(session_id, None)
    try:
        seconds = float(retention)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise bad_request(f"{RETENTION_HEADER} must be a positive number of seconds",
                          RETENTION_HEADER)
    return SessionHint(session_id, min(seconds, max_retention_s))


class SessionTable:
    """Which worker served each (tenant, session) last, until its deadline (module
    docstring), under ``config``'s bounds. ``clock``: monotonic seconds."""

    def __init__(self, config: SessionsConfig, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.config = config
        self._max_entries = config.max_entries
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def worker(self, tenant: str, session_id: str) -> str | None:
        """The worker that last served the session, None when none did or its
        deadline passed."""
        entry = self._entries.get((tenant, session_id))
        if entry is None:
            return None
        if entry[1] <= self._clock():
            del self._entries[(tenant, session_id)]
            return None
        return entry[0]

    def note(self, tenant: str, session_id: str, worker_id: str, ttl_s: float | None) -> None:
        """Record that ``worker_id`` served the session; kept ``ttl_s`` seconds (None:
        the configured ``ttl_s``)."""
        key = (tenant, session_id)
        self._entries[key] = (worker_id, self._clock() + (ttl_s or self.config.ttl_s))
        self._entries.move_to_end(key)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)


def prefer_session(ranked: Sequence[W], sticky: W | None, active: Callable[[W], int],
                   all_active: int, num_workers: int, factor: float) -> list[W]:
    """``ranked`` with ``sticky`` first when it is among them and its ``active``
    requests are below ``ceil(factor * (all_active + 1) / num_workers)``; else
    ``ranked`` as it is."""
    ranked = list(ranked)
    if sticky is None or sticky not in ranked:
        return ranked
    cap = math.ceil(factor * (all_active + 1) / max(num_workers, 1))
    if active(sticky) >= cap:
        return ranked
    return [sticky, *(w for w in ranked if w is not sticky)]
