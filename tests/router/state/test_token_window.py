"""The in-process token window: a reservation settles its prompt at its admission and
its output when it was produced, so no stream shorter than the window escapes it."""

from __future__ import annotations

import asyncio

from router.state.shared_state import InProcessSharedState


class Clock:
    """A settable clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def with_r1_reserved(clock: Clock) -> InProcessSharedState:
    """A 60 s window on ``clock`` in which alice's r1 reserved 2,000 tokens (admitted,
    asserted) under a limit of 1,000,000."""
    state = InProcessSharedState(60.0, clock)
    assert await state.reserve_tokens("alice", "r1", 2_000, 1_000_000) is None
    return state


def test_a_59_second_stream_is_charged_for_a_minute_after_it_ends():
    async def main() -> None:
        clock = Clock()
        state = await with_r1_reserved(clock)
        clock.now += 59.0
        await state.settle_tokens("alice", "r1", 2_000, 100, 50_000)
        assert await state.tokens_in_window("alice") == 50_100
        clock.now += 1.5  # the admission left the window; the output did not
        assert await state.tokens_in_window("alice") == 50_000
        assert await state.reserve_tokens("alice", "r2", 1, 50_000) is not None
        clock.now += 60.0
        assert await state.tokens_in_window("alice") == 0

    asyncio.run(main())


def test_a_reservation_gone_before_its_settle_charges_only_what_it_did_not_reserve():
    async def main() -> None:
        clock = Clock()
        state = await with_r1_reserved(clock)
        clock.now += 61.0
        await state.settle_tokens("alice", "r1", 2_000, 100, 1_500)
        assert await state.tokens_in_window("alice") == 0
        await state.settle_tokens("alice", "r2", 2_000, 100, 2_400)
        assert await state.tokens_in_window("alice") == 500

    asyncio.run(main())
