"""cancel_and_wait: the task ends, and a cancel of the caller is never swallowed."""

from __future__ import annotations

import asyncio

import pytest

from router.tasks import cancel_and_wait


async def slow_to_stop(stopped: list[str]) -> None:
    """Sleeps until cancelled, then takes a moment to clean up."""
    try:
        await asyncio.sleep(10)
    except asyncio.CancelledError:
        await asyncio.sleep(0.05)
        stopped.append("inner")
        raise


def test_the_task_is_cancelled_and_awaited() -> None:
    async def main() -> None:
        stopped: list[str] = []
        task = asyncio.create_task(slow_to_stop(stopped))
        await asyncio.sleep(0)
        await cancel_and_wait(task)
        assert task.cancelled() and stopped == ["inner"]

    asyncio.run(main())


def test_a_cancel_of_the_caller_while_it_waits_propagates() -> None:
    async def closer_loop(inner: asyncio.Task[None], rounds: list[int]) -> None:
        # A poll loop that stops a follower (the registry's shape): if the stop ate
        # this loop's own cancel, it would go round forever.
        while True:
            rounds.append(1)
            await cancel_and_wait(inner)
            await asyncio.sleep(0.01)

    async def main() -> None:
        inner = asyncio.create_task(slow_to_stop([]))
        await asyncio.sleep(0)
        rounds: list[int] = []
        closer = asyncio.create_task(closer_loop(inner, rounds))
        await asyncio.sleep(0.01)
        closer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(closer, 1.0)
        assert rounds == [1] and inner.done()

    asyncio.run(main())
