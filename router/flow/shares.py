"""What other router processes served each fairness id: the seam that makes flow
control's shares hold across routers.

``FlowShares.sync`` publishes this router's weighted tokens per flow over its recent
window and refreshes ``served_elsewhere``: the same totals summed over every other
live router. The fair queue lifts a flow served elsewhere behind the flows that were
not (``router.flow.fair_queue``). A router without shared state has no
``FlowShares``: nothing is served elsewhere. ``router.state.redis_state.flow_shares``
shares them through Redis.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol


class FlowShares(Protocol):
    """Weighted tokens per flow dispatched by the other routers, refreshed every
    ``interval_s``."""

    interval_s: float
    served_elsewhere: Mapping[str, float]

    async def sync(self, served_here: Mapping[str, float]) -> None:
        """Publish ``served_here`` and refresh ``served_elsewhere``; never raises for
        an unreachable store (``served_elsewhere`` is then empty: local shares only)."""
        ...
