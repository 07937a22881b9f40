"""Core dumps off: in a child process (the setting is for the process's life), the core
limit is zero and, on Linux, the process is not dumpable."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

CHECK = """
import ctypes, resource
from workers.kv.tiers.core_dumps import disable_core_dumps
assert ctypes.CDLL(None).prctl(3, 0, 0, 0, 0) == 1  # PR_GET_DUMPABLE: dumpable before
assert disable_core_dumps() is True
assert resource.getrlimit(resource.RLIMIT_CORE) == (0, 0)
assert ctypes.CDLL(None).prctl(3, 0, 0, 0, 0) == 0  # PR_GET_DUMPABLE
print("ok")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux-only")
def test_disable_core_dumps_sets_the_limit_and_the_dumpable_flag():
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
