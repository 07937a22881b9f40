"""The source of each span of a prompt's blocks on one worker: its device (local), its
own host or disk tier (restored by its admission), a peer (pulled), or nobody
(recomputed), chosen by one cost model (``radix.kv_sources.SourceCosts``).

Spans follow the prompt in order, because an engine reuses a contiguous chain from
the first block: ``[0, local)`` is on the worker's device, ``[local, own)`` in its
tiers, ``[own, own + pulled)`` comes from the chosen peer, and the rest is computed
(the prompt's last token always is). A pull is planned only when it moves at least
``PullRules.min_pull_tokens`` and its predicted time, ``PullRules.overhead_s`` plus
the peer's wait plus the bytes over the slower of the two links (or, from a peer
still receiving them, their arrival there when that is later: it relays them as they
come), is below the predicted recompute of the same span; among such peers the one
that saves the most wins. A pull this router already planned into the worker is a
peer too (``Peer.joins``): its blocks are on their way, so joining it costs the
overhead and the wait for them, and no bytes cross a link again. So no plan ever pulls below the
crossover or predicts a pull slower than the recompute it replaces (``check_plan``
says which rule a plan breaks, for the router's counter of such plans, which reads
0). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from radix.kv_sources import SourceCosts

LOCAL, RESTORE, PULL, JOIN, RECOMPUTE = "local", "restore", "pull", "join", "recompute"
SOURCES = (LOCAL, RESTORE, PULL, JOIN, RECOMPUTE)


class Holding(NamedTuple):
    """What a worker holds of the prompt as its KV events reported it: its chain of
    blocks on its device, and in any of its tiers (at least the device chain)."""

    device: int
    any_tier: int


@dataclass(frozen=True)
class Peer:
    """A worker that may send blocks: its stored chain of the prompt in any tier (it
    restores before it sends), the seconds before it can start (its link's queue, its
    busy engine thread), and its costs (its link rate). ``arrives_s``: a worker still
    receiving the blocks (a pull planned into it) has the last of them in that many
    seconds; it relays each as it arrives, so a pull from it ends no sooner.
    ``joins``: the worker the plan is for already pulls these blocks from it (planned
    earlier): ``wait_s`` is the time until they are there, and no byte crosses a link
    again."""

    worker_id: str
    num_tokens: int
    wait_s: float
    costs: SourceCosts
    joins: bool = False
    arrives_s: float = 0.0

    def pull_s(self, span: int, costs: SourceCosts, rules: PullRules) -> float:
        """Predicted seconds until ``span`` tokens from this peer are on a worker with
        ``costs``: the fixed overhead, and the wait and the bytes over the slower link,
        or the blocks' own arrival at the peer when that is later."""
        if self.joins:
            return rules.overhead_s + self.wait_s
        return rules.overhead_s + max(self.arrives_s, self.wait_s + max(
            costs.transfer_s(span), self.costs.transfer_s(span)))


@dataclass(frozen=True)
class PullRules:
    """When a pull may be planned: at least ``min_pull_tokens`` (the crossover), its
    fixed cost ``overhead_s`` counted; never for a worker lacking part of the prompt's
    public prefix on its device (received blocks are never public)."""

    min_pull_tokens: int
    overhead_s: float


@dataclass(frozen=True)
class SourcePlan:
    """Where each span of the prompt's blocks comes from on one worker (module
    docstring), with the predicted seconds of the pulled span by pull and by recompute
    (None without a pull). ``source`` names the plan: ``pull`` (a peer sends a span),
    ``join`` (a pull planned earlier into the worker brings the span), ``restore``
    (its tiers hold some), ``recompute`` (it computes whole blocks nobody holds) or
    ``local`` (its device holds every whole block it reuses)."""

    source: str
    num_local_tokens: int
    num_restored_tokens: int
    num_recomputed_tokens: int
    peer: str | None = None
    num_pulled_tokens: int = 0
    pull_s: float | None = None
    recompute_s: float | None = None

    @property
    def num_cached_tokens(self) -> int:
        """Tokens the worker will find cached when it runs the request."""
        return self.num_local_tokens + self.num_restored_tokens + self.num_pulled_tokens

    def credited_tokens(self) -> float:
        """The tokens the policy may count as cached on this worker: what it holds,
        plus the pulled span less its pull time counted in tokens of its recompute."""
        own = self.num_local_tokens + self.num_restored_tokens
        if self.pull_s is None or not self.recompute_s:
            return float(own)
        return own + self.num_pulled_tokens * (1.0 - self.pull_s / self.recompute_s)


def plan_sources(holding: Holding, peers: Sequence[Peer], num_prompt_tokens: int,
                 num_public_tokens: int, block_size: int, costs: SourceCosts,
                 rules: PullRules) -> SourcePlan:
    """The plan for a worker holding ``holding`` of a prompt of ``num_prompt_tokens``
    (its first ``num_public_tokens`` public), with ``costs``, among ``peers``."""
    reusable = (num_prompt_tokens - 1) // block_size * block_size
    local = min(holding.device, reusable) // block_size * block_size
    own = max(local, min(holding.any_tier, reusable) // block_size * block_size)
    best: SourcePlan | None = None
    if local >= num_public_tokens:
        for peer in peers:
            end = min(peer.num_tokens, reusable) // block_size * block_size
            span = end - own
            if span < rules.min_pull_tokens:
                continue
            pull_s = peer.pull_s(span, costs, rules)
            recompute_s = costs.recompute_s(own, end)
            if pull_s < recompute_s and (best is None or recompute_s - pull_s
                                         > best.recompute_s - best.pull_s):  # type: ignore[operator]
                best = SourcePlan(JOIN if peer.joins else PULL, local, own - local,
                                  num_prompt_tokens - end, peer.worker_id, span, pull_s,
                                  recompute_s)
    if best is not None:
        return best
    source = RESTORE if own > local else LOCAL if own == reusable else RECOMPUTE
    return SourcePlan(source, local, own - local, num_prompt_tokens - own)


def check_plan(plan: SourcePlan, rules: PullRules) -> str | None:
    """Which rule ``plan`` breaks (a pull below the crossover, or predicted no faster
    than the recompute it replaces); None when it breaks none."""
    if plan.peer is None:
        return None
    if plan.num_pulled_tokens < rules.min_pull_tokens:
        return "below the crossover"
    if plan.pull_s is None or plan.recompute_s is None or plan.pull_s >= plan.recompute_s:
        return "predicted slower than a recompute"
    return None
