"""What a vLLM follower does with a live batch's sequence number, and what a replay
shows: the pure part of ``router.fleet.events.vllm.follower``'s rules.

vLLM numbers its batches from 0 in every process, gapless, and keeps the last ones
for replay (``buffer_steps``). A replay from ``start`` answers every buffered batch
from ``start`` on, so it also tells where the server's sequence ends (its head): a
live batch the server published is always at or below the head of a replay asked
after it arrived.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence


class LiveStep(enum.Enum):
    """What a live batch calls for, given what was applied."""

    APPLY = "apply"  # the next one (or the first since a clear)
    DUPLICATE = "duplicate"  # at or below the last applied: a replay brought it already
    GAP = "gap"  # batches in between were missed: replay them
    WENT_BACK = "went_back"  # at or below the previous live one: a restart, or garbage


class Replayed(enum.Enum):
    """What a replay asked for a gap shows."""

    FILLED = "filled"  # it reaches back to the gap: apply it, nothing is lost
    LOST = "lost"  # no replay, or the buffer no longer holds the gap: clear the worker
    UNPUBLISHED = "unpublished"  # it ends before the live seq: that seq was garbage


def live_step(seq: int, last_seq: int | None, last_live_seq: int | None) -> LiveStep:
    """The step for live ``seq`` after ``last_seq`` was applied (None: nothing since the
    last clear) and ``last_live_seq`` was the previous live one accepted (None: none)."""
    if last_live_seq is not None and seq <= last_live_seq:
        return LiveStep.WENT_BACK
    if last_seq is None or seq == last_seq + 1:
        return LiveStep.APPLY
    if seq <= last_seq:
        return LiveStep.DUPLICATE
    return LiveStep.GAP


def gap_replayed(start: int, seq: int, replayed: Sequence[int] | None) -> Replayed:
    """What a replay from ``start`` (the first missed seq), asked when live ``seq``
    arrived, shows; ``replayed`` are the seqs it brought in order (None: no replay
    endpoint, or the replay failed or was abandoned)."""
    if replayed is None or (replayed and replayed[0] > start):
        return Replayed.LOST
    if not replayed or replayed[-1] < seq:
        return Replayed.UNPUBLISHED
    return Replayed.FILLED


def restarted(last_live_seq: int, replayed: Sequence[int] | None) -> bool:
    """Whether a live seq at or below ``last_live_seq`` means the server restarted,
    given the seqs a replay from that seq brought (None: no replay): yes unless the
    server's buffer still reaches ``last_live_seq`` (then the live seq was garbage)."""
    return not replayed or replayed[-1] < last_live_seq
