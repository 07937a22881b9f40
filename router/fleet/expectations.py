"""A model's expectations of its workers (``[models.M.expect]``), checked at every probe.

The namespace already keeps workers of other weights, KV format or numerics apart,
so a stranger under a model's name is never matched against the others' cache; but
it is still routed, and silently splits the model's cache (docs/operations.md, Split
pools). An expectation makes it not ready instead: ``mismatches`` compares what a
probe found (``Reported``) with ``ExpectConfig``, field by field, and the registry
keeps a worker with any mismatch out of routing, with the reason in
``GET /admin/workers`` and ``router_worker_expectation_mismatch{worker, field}``.

A field the worker does not report (an OpenAI-compatible server reports no weights
digest, KV dtype, scales or engine version) is a mismatch: the router cannot tell it
matches. Engine versions compare as release numbers (``0.10`` is after ``0.9``); a
worker's version with anything after its release number (``0.2.0.dev1``) is
compared by that release number.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from radix.kv_dtypes import canonical_dtype
from radix.namespace import CacheNamespace
from router.config import NO_SCALES, ExpectConfig

EXPECT_FIELDS = ("weights_digest", "kv_dtype", "kv_scales_digest", "min_engine_version")
_RELEASE = re.compile(r"^([0-9]+(?:\.[0-9]+)*)")


class Reported(NamedTuple):
    """What a probe found of a worker (None: not reported)."""

    weights_digest: str | None = None
    kv_dtype: str | None = None
    kv_scales_digest: str | None = None
    engine_version: str | None = None

    @classmethod
    def of(cls, namespace: CacheNamespace, engine_version: object) -> Reported:
        """A ``radix`` worker's: its base namespace's fields and ``/ready``'s
        ``engine_version`` (None unless a string)."""
        return cls(namespace.weights_digest, namespace.kv_dtype, namespace.kv_scales_digest,
                   engine_version if isinstance(engine_version, str) else None)


class Mismatch(NamedTuple):
    """One expectation a worker does not meet: the ``EXPECT_FIELDS`` name, what the
    model expects and what the worker reported (None: nothing)."""

    field: str
    expected: str
    reported: str | None

    def describe(self) -> str:
        """``field: expected X, reported Y`` (or ``not reported``)."""
        reported = "not reported" if self.reported is None else f"reported {self.reported!r}"
        return f"{self.field}: expected {self.expected!r}, {reported}"

    def to_dict(self) -> dict[str, str | None]:
        """For ``GET /admin/workers``."""
        return self._asdict()


def mismatches(expect: ExpectConfig, reported: Reported) -> tuple[Mismatch, ...]:
    """Every expectation of ``expect`` that ``reported`` does not meet, in
    ``EXPECT_FIELDS`` order (empty: the worker may be routed)."""
    found = []
    if expect.weights_digest is not None and reported.weights_digest != expect.weights_digest:
        found.append(Mismatch("weights_digest", expect.weights_digest, reported.weights_digest))
    if expect.kv_dtype is not None and reported.kv_dtype != canonical_dtype(expect.kv_dtype):
        found.append(Mismatch("kv_dtype", canonical_dtype(expect.kv_dtype), reported.kv_dtype))
    if expect.kv_scales_digest is not None:
        wanted = "" if expect.kv_scales_digest == NO_SCALES else expect.kv_scales_digest
        if reported.kv_scales_digest != wanted:
            found.append(Mismatch("kv_scales_digest", expect.kv_scales_digest,
                                  _scales_text(reported.kv_scales_digest)))
    if expect.min_engine_version is not None and not version_at_least(
            reported.engine_version, expect.min_engine_version):
        found.append(Mismatch("min_engine_version", expect.min_engine_version,
                              reported.engine_version))
    return tuple(found)


def describe(model: str, found: tuple[Mismatch, ...]) -> str:
    """The not-ready reason for ``found``: ``does not meet models.M.expect: weights_digest:
    expected ..., reported ...; ...``."""
    return f"does not meet models.{model}.expect: " + "; ".join(m.describe() for m in found)


def version_at_least(version: str | None, minimum: str) -> bool:
    """Whether ``version``'s release number is at least ``minimum``'s (False when
    ``version`` is None or does not start with a release number)."""
    found = _RELEASE.match(version or "")
    if found is None:
        return False
    return _release(found.group(1)) >= _release(minimum)


def _release(text: str) -> tuple[int, ...]:
    """``1.4`` -> (1, 4), trailing zeros dropped so ``1.4`` equals ``1.4.0``."""
    parts = [int(p) for p in text.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def _scales_text(digest: str | None) -> str | None:
    return NO_SCALES if digest == "" else digest
