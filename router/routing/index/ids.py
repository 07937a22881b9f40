"""Typed ids shared by the index, the event follower and the policies."""

from __future__ import annotations

from typing import NewType

WorkerId = NewType("WorkerId", str)
"""A worker's id in the router's registry (not the id a worker reports about itself)."""

NamespaceDigest = NewType("NamespaceDigest", str)
"""Hex digest of a cache namespace as the router computes it for a worker."""
