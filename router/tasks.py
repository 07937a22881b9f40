"""Stopping background tasks without losing the stopper's own cancellation."""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)

RECANCEL_S = 1.0


async def cancel_and_wait(task: asyncio.Task[None], recancel_s: float = RECANCEL_S) -> None:
    """Cancel ``task`` and wait until it has ended (an error it ended with is raised here).

    The cancel is repeated every ``recancel_s`` while the task runs on, and logged: a
    library that catches a ``CancelledError`` and carries on (redis-py's asyncio client
    can, while a command is being cancelled) would otherwise leave a loop such as the
    shared registry's sync running forever, and its closer waiting with it. A cancel
    of the *calling* task that arrives meanwhile still propagates, after cancelling
    ``task`` once more: ``suppress(CancelledError)`` around the wait would swallow it,
    and a poll loop stopped that way (the registry's, when a worker is removed while
    its poll is leaving it) would run on forever."""
    try:
        task.cancel()
        await asyncio.wait({task}, timeout=recancel_s)
        while not task.done():
            log.warning("task %s carried on after a cancel; cancelling it again",
                        task.get_name())
            task.cancel()
            await asyncio.wait({task}, timeout=recancel_s)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not task.cancelled():
        task.result()
