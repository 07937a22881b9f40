"""cancel_and_wait: the task ends, even one that swallows a cancel, and a cancel of the
caller is never swallowed."""

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


async def swallows_one_cancel(rounds: list[int]) -> None:
    """A poll loop that, like a library catching CancelledError, survives one cancel."""
    swallowed = False
    while True:
        rounds.append(1)
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed = True


def test_a_task_that_swallows_a_cancel_is_cancelled_again(caplog) -> None:
    async def main() -> None:
        rounds: list[int] = []
        task = asyncio.create_task(swallows_one_cancel(rounds))
        await asyncio.sleep(0.02)
        await asyncio.wait_for(cancel_and_wait(task, recancel_s=0.05), 1.0)
        assert task.cancelled() and len(rounds) >= 3

    asyncio.run(main())
    assert "carried on after a cancel" in caplog.text


def test_an_error_the_task_ended_with_is_raised_to_the_closer() -> None:
    async def fails() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    async def main() -> None:
        task = asyncio.create_task(fails())
        await asyncio.sleep(0)
        with pytest.raises(RuntimeError, match="cleanup failed"):
            await cancel_and_wait(task)

    asyncio.run(main())
