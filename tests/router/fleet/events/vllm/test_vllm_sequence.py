"""The vLLM follower's pure rules: what a live seq calls for, and what a replay shows
(``router.fleet.events.vllm.sequence``), case by case."""

from __future__ import annotations

import pytest

from router.fleet.events.vllm.sequence import (
    LiveStep,
    Replayed,
    gap_replayed,
    live_step,
    restarted,
)


@pytest.mark.parametrize(("seq", "last_seq", "last_live_seq", "step"), [
    (0, None, None, LiveStep.APPLY),  # the first batch
    (7, None, None, LiveStep.APPLY),  # the first since a clear, whatever its seq
    (5, 4, 4, LiveStep.APPLY),
    (5, 9, None, LiveStep.DUPLICATE),  # a replay applied up to 9 already
    (9, 9, None, LiveStep.DUPLICATE),
    (7, 4, 4, LiveStep.GAP),
    (4, 4, 4, LiveStep.WENT_BACK),  # the live stream never repeats a seq
    (0, 9, 9, LiveStep.WENT_BACK),
])
def test_the_step_for_a_live_seq(seq, last_seq, last_live_seq, step):
    assert live_step(seq, last_seq, last_live_seq) is step


@pytest.mark.parametrize(("replayed", "outcome"), [
    ([5, 6, 7, 8], Replayed.FILLED),  # from the gap to past the live seq
    ([5, 6, 7], Replayed.FILLED),
    (None, Replayed.LOST),  # no replay endpoint, or the replay failed
    ([6, 7], Replayed.LOST),  # the buffer no longer holds seq 5
    ([], Replayed.UNPUBLISHED),  # nothing since 4: the server never sent 7
    ([5, 6], Replayed.UNPUBLISHED),
])
def test_what_a_replay_over_a_gap_shows(replayed, outcome):
    assert gap_replayed(5, 7, replayed) is outcome


@pytest.mark.parametrize(("replayed", "is_restart"), [
    (None, True),  # no replay to tell: a restart, cleared to be safe
    ([], True),
    ([0, 1], True),  # the server's buffer ends below what was followed
    ([0, 1, 2, 3], False),  # it still reaches the last live seq: the seq was garbage
    ([0, 1, 2, 3, 4], False),
])
def test_whether_a_seq_that_went_back_is_a_restart(replayed, is_restart):
    assert restarted(3, replayed) is is_restart
