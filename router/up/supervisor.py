"""The restart policy of ``radix-router up``: keep each child serving, like compose's
``restart: on-failure`` with systemd's start limit.

Each child runs under a ``Supervised`` that watches it on its own thread. When the
child exits (a crash: the supervisor never stops a child except on shutdown), the
crash is counted; the crashes of the last ``crash_window_s`` decide what happens:

- fewer than ``max_crashes``: the child is started again after a backoff that starts
  at ``backoff_initial_s`` and doubles with each crash in the window, up to
  ``backoff_max_s`` (a child that served for a whole window starts from the
  beginning again);
- the ``max_crashes``-th: the child stays down for good and the supervisor says so.

A failed restart (the new child exits or times out before it serves) is a crash
too. Every decision is printed as one ``[name] ...`` line. The other children are
never touched: the rest of the deployment keeps serving. ``stop`` (set by the
owner on Ctrl-C or SIGTERM) ends every watch promptly; the owner then stops the
children by PID.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from router.config import LaunchConfig
from router.up.launcher import ChildProcess, Interrupted, ProcessFailed, echo_line

# Given the exited child, starts a fresh one and returns it once it serves;
# ProcessFailed (the new child stopped) if it cannot, Interrupted (the new child
# stopped) as soon as the second argument holds.
Restart = Callable[[ChildProcess, Callable[[], bool]], ChildProcess]


@dataclass(frozen=True)
class RestartPolicy:
    """When to start a crashed child again, and when to give up on it."""

    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    max_crashes: int = 5
    crash_window_s: float = 60.0

    @classmethod
    def from_launch(cls, launch: LaunchConfig) -> RestartPolicy:
        """The policy of the config's ``[launch]`` table."""
        return cls(launch.restart_backoff_initial_s, launch.restart_backoff_max_s,
                   launch.max_crashes, launch.crash_window_s)

    def delay_s(self, num_recent_crashes: int) -> float | None:
        """The wait before the next start after the ``num_recent_crashes``-th crash
        within the window (counting this one); None: give up."""
        if num_recent_crashes >= self.max_crashes:
            return None
        return min(self.backoff_initial_s * 2 ** (num_recent_crashes - 1), self.backoff_max_s)


def describe_exit(status: int) -> str:
    """``status 3`` or ``signal SIGKILL`` for a Popen return code."""
    if status < 0:
        try:
            return f"signal {signal.Signals(-status).name}"
        except ValueError:
            return f"signal {-status}"
    return f"status {status}"


class Supervised:
    """One child kept serving under ``policy``. ``child`` is always the latest
    process (the owner stops it at shutdown); ``given_up`` holds once the child
    stays down; ``num_restarts`` counts the restarts that served."""

    def __init__(self, name: str, child: ChildProcess, restart: Restart,
                 policy: RestartPolicy, stop: threading.Event) -> None:
        self.name, self.child = name, child
        self.given_up = False
        self.num_restarts = 0
        self._restart, self._policy, self._stop = restart, policy, stop
        self._crash_times: list[float] = []
        self._thread = threading.Thread(target=self._watch, name=f"supervise-{name}",
                                        daemon=True)

    def start(self) -> None:
        """Begin watching (the child already serves)."""
        self._thread.start()

    def join(self, timeout_s: float | None = None) -> None:
        """Wait for the watch to end (after ``stop`` is set, or after giving up); at
        once if it never started."""
        if self._thread.ident is not None:
            self._thread.join(timeout_s)

    def _watch(self) -> None:
        while not self._stop.is_set():
            if self._stop.wait(0.1) or self.child.poll() is None:
                continue
            self.child.stop()  # reaps it and ends its output reader
            delay_s = self._crashed(describe_exit(self.child.proc.returncode))
            while delay_s is not None:
                if self._stop.wait(delay_s):
                    return
                try:
                    self.child = self._restart(self.child, self._stop.is_set)
                except Interrupted:
                    return
                except ProcessFailed as exc:
                    echo_line(self.name, f"restart failed: {str(exc).splitlines()[0]}")
                    delay_s = self._crashed("a failed restart")
                    continue
                self.num_restarts += 1
                echo_line(self.name, f"restarted (pid {self.child.proc.pid})")
                break
            if delay_s is None:
                return

    def _crashed(self, how: str) -> float | None:
        """Count a crash; print and return the backoff, or give up (None)."""
        now = time.monotonic()
        window_s = self._policy.crash_window_s
        self._crash_times = [t for t in self._crash_times if now - t < window_s] + [now]
        count, limit = len(self._crash_times), self._policy.max_crashes
        delay_s = self._policy.delay_s(count)
        if delay_s is None:
            self.given_up = True
            echo_line(self.name, f"exited ({how}): {count} crashes within {window_s:g} s; "
                                 f"giving up, it stays down (the rest keeps serving; restart "
                                 f"`up` to bring it back)")
        else:
            echo_line(self.name, f"exited ({how}); restarting in {delay_s:g} s (crash "
                                 f"{count} within {window_s:g} s; crash {limit} leaves it down)")
        return delay_s
