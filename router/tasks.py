"""Stopping background tasks without losing the stopper's own cancellation."""

from __future__ import annotations

import asyncio


async def cancel_and_wait(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` and wait until it has ended. A cancel of the *calling* task that
    arrives meanwhile still propagates: ``suppress(CancelledError)`` around the wait
    would swallow it too, and a poll loop stopped that way (the registry's, when a
    worker is removed while its poll is leaving it) runs on forever and keeps its
    closer, or the event loop's shutdown, waiting."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
