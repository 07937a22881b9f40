"""SGLang's own KV event publisher and recorder in a child process, for follower tests.

``make sglang`` builds ``.sglang/venv`` (the ``sglang`` wheel without its dependencies,
which pull a CUDA torch, plus the four its event code imports); ``SglangPublisher``
runs ``sglang_recorder_main.py`` there (its docstring says what is SGLang's and what
stands in) and drives it: insert a sequence for a salt and an adapter, evict a leaf,
clear, publish a batch. Plain module, no pytest.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
SGLANG_PYTHON = REPO_ROOT / ".sglang" / "venv" / "bin" / "python"
_MAIN = Path(__file__).with_name("sglang_recorder_main.py")


def available() -> str | None:
    """None when ``.sglang/venv`` has SGLang's event code, else what is missing."""
    if not SGLANG_PYTHON.exists():
        return f"{SGLANG_PYTHON} missing (make sglang)"
    found = subprocess.run([str(SGLANG_PYTHON), "-c", "import importlib.util as u; "
                            "print(u.find_spec('sglang') is not None)"],
                           capture_output=True, text=True, check=False)
    return None if found.stdout.strip() == "True" else "sglang not installed (make sglang)"


@dataclass(frozen=True)
class HeldNode:
    """A node of SGLang's tree: its salt, adapter and the tokens from the root to its
    end (each position's own token)."""

    salt: str | None
    lora: str | None
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Published:
    """After a publish: the last sequence number sent (None: none yet) and the tree."""

    seq: int | None
    nodes: tuple[HeldNode, ...]


class SglangPublisher:
    """SGLang's publisher binding ``events`` and ``replay``, with a radix tree of
    ``page_size``-token pages (bigram pages with ``bigram``)."""

    def __init__(self, events: str, replay: str, page_size: int, bigram: bool = False) -> None:
        self._process = subprocess.Popen(
            [str(SGLANG_PYTHON), str(_MAIN), events, replay, str(page_size),
             "1" if bigram else "0"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def _call(self, **command: Any) -> dict[str, Any]:
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(json.dumps(command) + "\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError(f"the SGLang recorder exited ({self._process.wait()})")
        return json.loads(line)

    def insert(self, tokens: list[int], salt: str | None, lora: str | None = None) -> None:
        """Cache ``tokens`` (their whole pages) for ``salt`` under adapter ``lora``."""
        self._call(op="insert", tokens=tokens, salt=salt, lora=lora)

    def evict(self, leaf: int) -> None:
        """Evict the ``leaf``-th leaf (modulo their number, oldest first)."""
        self._call(op="evict", leaf=leaf)

    def clear(self) -> None:
        """Reset the cache (``AllBlocksCleared``)."""
        self._call(op="clear")

    def publish(self) -> Published:
        """Send what was recorded since the last publish as one batch."""
        answer = self._call(op="publish")
        return Published(answer["seq"], tuple(HeldNode(s, lora, tuple(tokens))
                                              for s, lora, tokens in answer["nodes"]))

    def close(self) -> None:
        """End the process (its publisher shuts down on end of input)."""
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
