"""Where a gate run ran, for its verdict: engine version, device, the cache namespaces
and their digests, and the prompt sets' digests.

The namespace is the one a worker started with the same config derives
(``workers.build.cache_namespace``) and its digest is taken under the deployment
secret ``$RADIX_ROUTER_SECRET``, so it equals the ``namespace_digest`` that worker
reports in ``/info``; without the variable a random secret is used and the record
says so (its digests then match nothing else).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import torch

from bench.quality.prompts import PROMPTS_FILE
from bench.quality.session import Session
from bench.quality.user_prompts import UserPromptFile
from radix.namespace import SECRET_ENV, load_secret
from radix.version import project_version


@dataclass(frozen=True)
class Secret:
    """The secret namespace digests are taken under, and where it came from."""

    value: bytes
    source: str

    @classmethod
    def load(cls) -> Secret:
        """``$RADIX_ROUTER_SECRET``, else a random one (a warning is logged)."""
        source = (f"${SECRET_ENV}" if os.environ.get(SECRET_ENV)
                  else f"a random secret (${SECRET_ENV} unset: digests of this run only)")
        return cls(load_secret(), source)


@dataclass(frozen=True)
class RunRecord:
    """Where one candidate was gated: the project's version, the device, the secret's
    source, the baseline's and the candidate's namespace (fields and digest), and the
    sha256 of the shipped prompt set and of the user's prompt file (None: none)."""

    engine_version: str
    device: str
    secret_source: str
    baseline_namespace: dict[str, object]
    candidate_namespace: dict[str, object]
    shipped_prompts_sha256: str
    user_prompts: str | None
    user_prompts_sha256: str | None

    @classmethod
    def of(cls, baseline: Session, candidate: Session, device: torch.device, secret: Secret,
           user: UserPromptFile | None) -> RunRecord:
        """The record of ``candidate`` gated against ``baseline`` on ``device``."""
        shipped = hashlib.sha256(PROMPTS_FILE.read_bytes()).hexdigest()
        return cls(project_version(), describe_device(device), secret.source,
                   _namespace(baseline), _namespace(candidate), shipped,
                   None if user is None else str(user.path),
                   None if user is None else user.sha256)

    def lines(self) -> list[str]:
        """The record as report lines."""
        user = ("none" if self.user_prompts is None
                else f"`{self.user_prompts}` sha256 {self.user_prompts_sha256}")
        return [
            f"engine version {self.engine_version} on {self.device}",
            f"namespace digests (under {self.secret_source}): baseline "
            f"{self.baseline_namespace['digest']}, candidate {self.candidate_namespace['digest']}",
            f"prompts: shipped set sha256 {self.shipped_prompts_sha256}; user file {user}",
        ]


def describe_device(device: torch.device) -> str:
    """``cpu``, or ``cuda (the GPU's name)``."""
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return device.type


def _namespace(session: Session) -> dict[str, object]:
    return {"digest": session.namespace_digest, "fields": session.namespace.to_dict()}
