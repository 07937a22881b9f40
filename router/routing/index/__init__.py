"""The router's index of cached prefixes (docs/router-index.md).

``RouterIndex`` is the entry point; ``exact`` mirrors the workers' KV events,
``approx`` keeps what was routed to each worker for a while.
"""

from router.routing.index.ids import NamespaceDigest, WorkerId
from router.routing.index.router_index import IndexStats, RouterIndex

__all__ = ["IndexStats", "NamespaceDigest", "RouterIndex", "WorkerId"]
