"""Core dumps off while host memory holds tenants' KV.

A core dump writes the process's memory to disk in the clear, the host tier's
plaintext staging buffers and device-to-host copies with it, outside the tier's
encryption and expiry. A worker with a host tier therefore sets ``RLIMIT_CORE`` to
zero and, on Linux, marks itself not dumpable (``PR_SET_DUMPABLE`` 0: no core,
and no ptrace attach or ``/proc/PID/mem`` read by other processes of the same
user).
"""

from __future__ import annotations

import ctypes
import logging
import resource
import sys

_PR_SET_DUMPABLE = 4
log = logging.getLogger(__name__)


def disable_core_dumps() -> bool:
    """Set the core size limit to zero and, on Linux, the process not dumpable.
    Returns True when both took effect (False off Linux or when prctl failed,
    with a warning); the rlimit always does."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_DUMPABLE, 0) failed: errno %d", ctypes.get_errno())
        return False
    return True
