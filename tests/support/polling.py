"""Waiting from synchronous test code (threads, processes) until something holds; the
asynchronous twin is ``tests.support.aio.eventually``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 20.0


def wait_until(predicate: Callable[[], T], timeout_s: float = DEFAULT_TIMEOUT_S,
               what: str | Callable[[], object] = "the condition",
               interval_s: float = 0.1) -> T:
    """Call ``predicate()`` every ``interval_s`` until it returns a truthy value, and
    return that value. After ``timeout_s`` raise AssertionError naming ``what`` (when
    it is a callable, what it returns then: the state the test waited on) and the last
    value. Exceptions from ``predicate`` propagate at once."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() >= deadline:
            described = what() if callable(what) else what
            raise AssertionError(f"waited {timeout_s} s for {described}; "
                                 f"the last value was {value!r}")
        time.sleep(interval_s)
    return value
