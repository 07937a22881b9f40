"""What the discovery watchers have seen and suffered, for ``GET /admin/discovery`` and
``/metrics``: lists, watch events, errors by reason and the last error's words, and
the pods refused (``pods.refusal``) with their reasons."""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from router.fleet.discovery.pods import REFUSAL_REASONS

log = logging.getLogger(__name__)
ERROR_REASONS = ("expired", "forbidden", "closed", "unreachable", "error")


class StreamClosed(Exception):
    """A watch stream ended before its deadline (the server or the network closed it)."""


def error_reason(exc: BaseException) -> str:
    """The ``reason`` label of a failed list or watch: ``expired`` (410 Gone: the
    resource version is compacted), ``forbidden`` (401/403: RBAC or credentials),
    ``closed`` (the stream ended early), ``unreachable`` (no connection, a timeout),
    ``error`` (anything else)."""
    # Imported here: the client's package costs a router half a second and tens of MB
    # at start, which only a router that discovers should pay.
    from kubernetes_asyncio.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        if exc.status == 410:
            return "expired"
        if exc.status in (401, 403):
            return "forbidden"
        return "error"
    if isinstance(exc, StreamClosed):
        return "closed"
    if isinstance(exc, aiohttp.ClientError | OSError | asyncio.TimeoutError):
        return "unreachable"
    return "error"


class DiscoveryStatus:
    """Counters of one router's discovery. ``up`` is True from a successful LIST until
    the next error; a 403 is logged as an error saying which permission is missing,
    other errors as warnings, each kind once until a LIST succeeds again."""

    def __init__(self, kind: str, namespace: str) -> None:
        self.kind = kind
        self.namespace = namespace
        self.up = False
        self.num_lists = 0
        self.num_events = 0
        self.num_errors = dict.fromkeys(ERROR_REASONS, 0)
        self.last_error: str | None = None
        self.num_pods = 0
        self.num_skipped = 0
        self.num_refused = dict.fromkeys(REFUSAL_REASONS, 0)
        self.refused: dict[str, str] = {}
        self._refused_uids: set[tuple[str, str]] = set()
        self._logged: set[str] = set()

    def listed(self) -> None:
        """A LIST succeeded."""
        self.up = True
        self.num_lists += 1
        self._logged.clear()

    def failed(self, what: str, exc: BaseException) -> str:
        """A LIST or WATCH of ``what`` failed with ``exc``: count and log it; returns
        the reason."""
        reason = error_reason(exc)
        self.up = False
        self.num_errors[reason] += 1
        detail = f"{type(exc).__name__}: {exc}".strip()
        if reason == "forbidden":
            detail = (f"the API server refused to list or watch {what} in namespace "
                      f"{self.namespace!r} ({detail.splitlines()[0]}); the router's service "
                      f"account needs get, list and watch on them "
                      f"(deploy/kubernetes/router.yaml, Role radix-router)")
        self.last_error = f"{reason}: {detail.splitlines()[0] if detail else reason}"
        if reason not in self._logged:
            self._logged.add(reason)
            (log.error if reason == "forbidden" else log.warning)(
                "discovery of %s: %s (relisting)", what, self.last_error)
        return reason

    def refuse(self, pods: dict[str, tuple[str, str, str]]) -> None:
        """The pods refused now, as UID -> (name, reason, detail): ``refused`` becomes
        them (name -> "reason: detail"); each pod is counted and logged once per
        reason, however many times it is judged again."""
        now = {(uid, reason) for uid, (_, reason, _) in pods.items()}
        for uid, (name, reason, detail) in pods.items():
            if (uid, reason) not in self._refused_uids:
                self.num_refused[reason] += 1
                log.warning("discovered pod %s refused (%s): %s; it gets no key and no "
                            "request", name, reason, detail)
        self._refused_uids = now
        self.refused = {name: f"{reason}: {detail}" for name, reason, detail in pods.values()}

    def to_dict(self) -> dict[str, object]:
        """JSON view for ``GET /admin/discovery``."""
        return {"kind": self.kind, "namespace": self.namespace, "up": self.up,
                "num_lists": self.num_lists, "num_events": self.num_events,
                "num_errors": dict(self.num_errors), "last_error": self.last_error,
                "num_pods": self.num_pods, "num_skipped": self.num_skipped,
                "num_refused": dict(self.num_refused), "refused": dict(self.refused)}
