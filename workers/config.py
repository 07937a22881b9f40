"""Worker configuration: one frozen dataclass per component, loaded from TOML.

A TOML file has one table per component (``[server]``, ``[model]``, ``[kv]``,
``[engine]``) whose keys are the dataclass fields; command-line flags override
single fields (see ``workers.cli``). Every value is type-checked and validated on
construction; a bad value raises ``ValueError`` naming ``section.field``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import tomllib

HASH_ALGORITHMS = ("blake2b", "xxh3_128")
KV_CACHE_DTYPES = ("auto", "fp8_e4m3", "fp8_e5m2")
PREEMPTION_MODES = ("recompute", "swap", "auto")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class ServerConfig:
    """HTTP side: where to listen, who may call, and per-request limits.

    ``port`` 0 picks a free port. ``api_key_file`` names a file holding the worker's
    API key (see ``workers.server.access``: without it the key comes from the
    environment, and a worker with no key listens on loopback only).
    ``self_test_delay_s`` holds ``/ready`` at 503 that long before the start-up
    self-test (for exercising launchers that wait on readiness). On SIGTERM the
    worker drains: ``/ready`` answers 503 and new requests 503 with Retry-After at
    once, requests in flight get up to ``drain_timeout_s`` to finish, then it exits.
    """

    host: str = "127.0.0.1"
    port: int = 0
    worker_id: str | None = None
    api_key_file: str | None = None
    request_timeout_s: float = 600.0
    default_max_tokens: int = 256
    max_n: int = 16
    kv_events_heartbeat_s: float = 5.0
    self_test_delay_s: float = 0.0
    drain_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        _require(0 <= self.port <= 65535, "server.port", self.port, "in [0, 65535]")
        _require(bool(self.host), "server.host", self.host, "non-empty")
        _require(self.worker_id != "", "server.worker_id", self.worker_id, "non-empty or unset")
        _require(self.api_key_file != "", "server.api_key_file", self.api_key_file,
                 "non-empty or unset")
        _require(
            self.request_timeout_s > 0, "server.request_timeout_s", self.request_timeout_s, "> 0"
        )
        _require(
            self.default_max_tokens > 0, "server.default_max_tokens", self.default_max_tokens, "> 0"
        )
        _require(self.max_n >= 1, "server.max_n", self.max_n, ">= 1")
        _require(
            self.kv_events_heartbeat_s > 0,
            "server.kv_events_heartbeat_s",
            self.kv_events_heartbeat_s,
            "> 0",
        )
        _require(
            self.self_test_delay_s >= 0, "server.self_test_delay_s", self.self_test_delay_s, ">= 0"
        )
        _require(self.drain_timeout_s >= 0, "server.drain_timeout_s", self.drain_timeout_s, ">= 0")


@dataclass(frozen=True)
class ModelSettings:
    """Which model to serve and under which names.

    ``name`` is ``demo``, a packaged model (``radix.model_source.PACKAGED_MODELS``), a
    GGUF file or a local Hugging Face directory. ``served_model_names`` are the names
    clients may send as ``model`` (the first is the one responses carry); empty means
    ``name`` exactly as given, as vLLM does. ``max_model_len`` None means the model's
    own maximum. ``num_threads`` sets torch's
    CPU thread count for the process (None: torch's default); one thread avoids
    oversubscription when several workers share a small machine.
    """

    name: str = "demo"
    served_model_names: tuple[str, ...] = ()
    device: str = "cpu"
    max_model_len: int | None = None
    num_threads: int | None = None

    @property
    def served_names(self) -> tuple[str, ...]:
        """The names this model answers to, the response name first."""
        return self.served_model_names or (self.name,)

    def __post_init__(self) -> None:
        _require(bool(self.name), "model.name", self.name, "non-empty")
        names = tuple(self.served_model_names)
        _require(all(isinstance(n, str) and n for n in names), "model.served_model_names",
                 self.served_model_names, "a list of non-empty strings")  # fmt: skip
        object.__setattr__(self, "served_model_names", names)
        _require(self.device in DEVICES, "model.device", self.device, f"one of {DEVICES}")
        _require(
            self.max_model_len is None or self.max_model_len > 0,
            "model.max_model_len",
            self.max_model_len,
            "> 0 or unset",
        )


@dataclass(frozen=True)
class KVSettings:
    """The paged KV cache: byte budget, block size, KV dtype, prefix cache and event log.

    ``prefix_cache`` False selects the null prefix cache (nothing is ever shared).
    ``cache_dtype`` ``auto`` stores K/V in the model's dtype; ``fp8_e4m3`` and
    ``fp8_e5m2`` store them in one byte with per-layer scales from ``scales_file``
    (a ``workers.kv.calibrate`` record; unset: unit scales, with a warning).
    ``host_cache_bytes`` > 0 adds the host-memory tier of that size (whole blocks;
    needs the prefix cache): evicted blocks move there, sealed, instead of vanishing.
    """

    cache_bytes: int = 256 * 2**20
    block_size: int = 16
    cache_dtype: str = "auto"
    scales_file: str | None = None
    host_cache_bytes: int = 0
    prefix_cache: bool = True
    hash_algorithm: str = "blake2b"
    event_log_size: int = 65536

    def __post_init__(self) -> None:
        _require(self.cache_bytes > 0, "kv.cache_bytes", self.cache_bytes, "> 0")
        _require(self.cache_dtype in KV_CACHE_DTYPES, "kv.cache_dtype", self.cache_dtype,
                 f"one of {KV_CACHE_DTYPES}")  # fmt: skip
        _require(self.host_cache_bytes >= 0, "kv.host_cache_bytes", self.host_cache_bytes, ">= 0")
        _require(self.prefix_cache or not self.host_cache_bytes, "kv.host_cache_bytes",
                 self.host_cache_bytes, "0 without the prefix cache")  # fmt: skip
        _require(self.scales_file is None or self.cache_dtype != "auto", "kv.scales_file",
                 self.scales_file, "unset unless kv.cache_dtype is an FP8 dtype")  # fmt: skip
        _require(self.block_size > 0, "kv.block_size", self.block_size, "> 0")
        _require(
            self.hash_algorithm in HASH_ALGORITHMS,
            "kv.hash_algorithm",
            self.hash_algorithm,
            f"one of {HASH_ALGORITHMS}",
        )
        _require(self.event_log_size > 0, "kv.event_log_size", self.event_log_size, "> 0")


@dataclass(frozen=True)
class EngineConfig:
    """Continuous batching limits.

    ``max_batched_tokens``: tokens computed per step (decodes count one each; long
    prompts are prefilled in chunks of what is left). ``max_num_seqs``: sequences
    running at once. ``max_waiting_requests``: queue bound, beyond which requests
    are refused (HTTP 429). ``preemption_mode``: a preempted sequence's KV is
    ``recompute``d later (kept as ordinary cached blocks meanwhile), ``swap``ped out
    to the host tier at once, or, with ``auto``, swapped when it has at least
    ``swap_min_tokens`` computed tokens (recomputing a long prefix costs more than
    copying it back).
    """

    max_batched_tokens: int = 512
    max_num_seqs: int = 64
    max_waiting_requests: int = 256
    preemption_mode: str = "recompute"
    swap_min_tokens: int = 256

    def __post_init__(self) -> None:
        _require(
            self.max_batched_tokens > 0, "engine.max_batched_tokens", self.max_batched_tokens, "> 0"
        )
        _require(self.max_num_seqs > 0, "engine.max_num_seqs", self.max_num_seqs, "> 0")
        _require(self.preemption_mode in PREEMPTION_MODES, "engine.preemption_mode",
                 self.preemption_mode, f"one of {PREEMPTION_MODES}")  # fmt: skip
        _require(self.swap_min_tokens > 0, "engine.swap_min_tokens", self.swap_min_tokens, "> 0")
        _require(
            self.max_waiting_requests > 0,
            "engine.max_waiting_requests",
            self.max_waiting_requests,
            "> 0",
        )


@dataclass(frozen=True)
class WorkerConfig:
    """The whole worker configuration, one section per component."""

    server: ServerConfig = field(default_factory=ServerConfig)
    model: ModelSettings = field(default_factory=ModelSettings)
    kv: KVSettings = field(default_factory=KVSettings)
    engine: EngineConfig = field(default_factory=EngineConfig)

    def with_overrides(self, overrides: Mapping[str, Mapping[str, Any]]) -> WorkerConfig:
        """A copy with ``{section: {field: value}}`` replaced (validated like TOML values)."""
        changed = {}
        for section, values in overrides.items():
            current = getattr(self, _section_name(section))
            _check_fields(section, type(current), values)
            changed[section] = replace(current, **values)
        return replace(self, **changed)


def load_config(path: str | Path | None) -> WorkerConfig:
    """Read a TOML file (None: all defaults). Unknown sections or keys, wrong types and
    invalid values raise ``ValueError`` naming the field."""
    if path is None:
        return WorkerConfig()
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"config {path}: {exc}") from exc
    for section, values in data.items():
        if not isinstance(values, dict):
            raise ValueError(f"config {path}: [{section}] must be a table")
    return WorkerConfig().with_overrides(data)


_SECTIONS = {f.name for f in fields(WorkerConfig)}
_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (float, int),
    "bool": (bool,),
    "str | None": (str, type(None)),
    "int | None": (int, type(None)),
    "tuple[str, ...]": (list, tuple),
}


def _section_name(section: str) -> str:
    if section not in _SECTIONS:
        raise ValueError(f"unknown config section {section!r} (known: {sorted(_SECTIONS)})")
    return section


def _check_fields(section: str, cls: type, values: Mapping[str, Any]) -> None:
    known = {f.name: f.type for f in fields(cls)}
    for name, value in values.items():
        if name not in known:
            raise ValueError(f"unknown config field {section}.{name}")
        allowed = _TYPES[str(known[name])]
        is_bool = isinstance(value, bool)
        if not isinstance(value, allowed) or (is_bool and bool not in allowed):
            raise ValueError(f"{section}.{name} must be {known[name]}, got {value!r}")


def _require(ok: bool, name: str, value: object, rule: str) -> None:
    if not ok:
        raise ValueError(f"{name} must be {rule}, got {value!r}")
