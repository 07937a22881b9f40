"""Worker configuration: one frozen ``radix.config_schema.Section`` per component.

A TOML file has one table per component (``[server]``, ``[model]``, ``[kv]``,
``[engine]``, ``[lora]``, ``[kv_transfer]``) whose keys are the dataclass fields; a
field declaring a ``flag`` is also a command-line flag, its one declaration
(``radix.config_flags`` builds ``workers.cli``'s parser from it). Every value is
type-checked and validated on construction; a bad value raises ``ValueError`` naming
``section.field``, and an unknown section or key is an error.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from radix.config_flags import parse_bytes
from radix.config_schema import FieldError, Section, read_section, setting

HASH_ALGORITHMS = ("blake2b", "xxh3_128")
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8_e4m3", "fp8_e5m2")
PREEMPTION_MODES = ("recompute", "swap", "auto")
DEVICES = ("auto", "cpu", "cuda")
DEFAULT_CACHE_BYTES = 256 * 2**20
KV_ROLES = ("none", "kv_producer", "kv_consumer", "kv_both")
KV_TRANSFER_FALLBACKS = ("fail", "recompute")


@dataclass(frozen=True)
class ServerConfig(Section, section="server"):
    """HTTP side: where to listen, who may call, and per-request limits.

    ``port`` 0 picks a free port. ``api_key_file`` names a file holding the worker's
    API key (see ``workers.server.access``: without it the key comes from the
    environment, and a worker with no key listens on loopback only).
    ``self_test_delay_s`` holds ``/ready`` at 503 that long before the start-up
    self-test (for exercising launchers that wait on readiness). On SIGTERM the
    worker drains: ``/ready`` answers 503 and new requests 503 with Retry-After at
    once, requests in flight get up to ``drain_timeout_s`` to finish, then it exits.
    ``kv_events_heartbeat_s``: an idle KV event stream's heartbeat;
    ``load_push_interval_s``: the least time between two load frames on one (changes
    within it are sent together).
    """

    host: str = setting("127.0.0.1", flag="--host", help="address to listen on")
    port: int = setting(0, low=0, high=65535, flag="--port",
                        help="port to listen on; 0 picks a free one")
    worker_id: str | None = setting(None, flag="--worker-id",
                                    help="id in KV events and /ready (default HOST:PORT)")
    api_key_file: str | None = None
    request_timeout_s: float = setting(600.0, above=0)
    default_max_tokens: int = setting(256, low=1)
    max_n: int = setting(16, low=1)
    kv_events_heartbeat_s: float = setting(5.0, above=0)
    load_push_interval_s: float = setting(
        0.005, above=0, flag="--load-push-interval-s",
        help="at most one load frame per this many seconds on a KV event stream")
    self_test_delay_s: float = setting(0.0, low=0, flag="--self-test-delay-s",
                                       help="hold /ready at 503 this long before the self-test")
    drain_timeout_s: float = setting(30.0, low=0, flag="--drain-timeout-s",
                                     help="on SIGTERM, how long requests in flight may take "
                                          "to finish")


@dataclass(frozen=True)
class ModelSettings(Section, section="model"):
    """Which model to serve and under which names.

    ``name`` is ``demo``, a packaged model (``radix.model_source.PACKAGED_MODELS``), a
    GGUF file or a local Hugging Face directory. ``served_model_names`` are the names
    clients may send as ``model`` (the first is the one responses carry); empty means
    ``name`` exactly as given, as vLLM does. ``max_model_len`` None means the model's
    own maximum. ``num_threads`` sets torch's
    CPU thread count for the process (None: torch's default); one thread avoids
    oversubscription when several workers share a small machine. ``time_scale``
    multiplies every wait of a timed model (``timed:<profile>``): a cluster of many
    timed workers on a few cores runs that many times slower than the GPUs it models,
    so the engine's own CPU time stays small beside the waits (benchmarks divide what
    they measure by it). ``enforce_eager`` turns off the CUDA graphs decode steps are
    otherwise replayed from on CUDA (vLLM's ``--enforce-eager``; the CPU is always
    eager). ``numerics_version`` overrides the engine numerics version the cache
    namespace carries (None: this build's ``ENGINE_NUMERICS_VERSION``,
    ``workers.model.numerics``): for a build whose kernels were changed locally, and
    for tests of a split pool; workers with different values never share KV.
    """

    name: str = setting("demo", flag="--model",
                        help="'demo', 'SmolLM2-135M-Instruct' (packaged), a GGUF file or a "
                             "local Hugging Face model directory")
    served_model_names: tuple[str, ...] = setting(
        (), flag="--served-model-name", metavar="NAME",
        help="names clients send as 'model' (the first is used in responses; default: "
             "--model exactly as given)")
    device: str = setting("cpu", choices=DEVICES, flag="--device",
                          help="where the model runs")
    max_model_len: int | None = setting(None, low=1, flag="--max-model-len",
                                        help="cap on prompt + output tokens (default: the "
                                             "model's own)")
    num_threads: int | None = setting(None, low=1, flag="--num-threads",
                                      help="torch CPU threads (default: torch's choice; 1 on "
                                           "small machines running several processes)")
    time_scale: float = setting(1.0, above=0, flag="--time-scale",
                                help="timed models only: every wait this many times longer")
    enforce_eager: bool = setting(False, flag="--enforce-eager",
                                  help="CUDA: run every decode step eagerly instead of "
                                       "replaying it from CUDA graphs (docs/model.md, Decode "
                                       "graphs); the CPU is always eager")
    numerics_version: int | None = setting(
        None, low=1, flag="--engine-numerics-version",
        help="engine numerics version in the cache namespace (default: this build's); "
             "only for locally changed kernels and tests: workers with different values "
             "never share KV")

    @property
    def served_names(self) -> tuple[str, ...]:
        """The names this model answers to, the response name first."""
        return self.served_model_names or (self.name,)


@dataclass(frozen=True)
class KVSettings(Section, section="kv"):
    """The paged KV cache: its size, block size, KV dtype, prefix cache and event log.

    Size: ``cache_bytes`` when set; unset, ``DEFAULT_CACHE_BYTES`` on the CPU and, on
    CUDA, ``gpu_memory_utilization`` with vLLM's meaning (that fraction of the GPU's
    total memory, less the weights and the peak activation of one profile forward of
    ``engine.max_batched_tokens`` tokens; ``workers.engine.kv_sizing``). A timed
    model (``timed:<profile>``) plans its profile's memory instead, or
    ``timed_cache_bytes`` when set (a GPU that leaves less for KV: a smaller cache
    whose LRU turns over sooner, for benchmarks).
    ``watermark``: the fraction of the blocks admission keeps obtainable for running
    sequences to grow into (``workers.kv.manager``, decode headroom).

    ``prefix_cache`` False selects the null prefix cache (nothing is ever shared).
    ``cache_dtype`` ``auto`` stores K/V in the model's dtype; ``bfloat16`` in bf16
    (the model's dtype on a GPU; on the CPU beside a float32 model, what a GPU's cache
    holds, for the quality gate); ``fp8_e4m3`` and
    ``fp8_e5m2`` store them in one byte with the scales of ``scales_file`` (a
    ``workers.model.calibrate`` record); an FP8 cache without one starts only with
    ``allow_unit_scales`` (every scale 1.0, with a warning), and only on a GPU of
    compute capability 8.9 or newer (``workers.kv.fp8_device``).
    ``host_cache_bytes`` > 0 adds the host-memory tier of that size (whole blocks;
    needs the prefix cache): evicted blocks move there, sealed, instead of vanishing;
    ``host_ttl_s`` (None: none) drops host entries that long after they arrived.
    ``disk_cache_bytes`` > 0 adds a disk tier of that size under ``disk_cache_dir``
    below the host tier (it needs one): what the host tier drops is written there,
    and a restarted worker with the same directory and secret takes it back.
    """

    cache_bytes: int | None = setting(
        None, low=1, flag="--kv-cache-bytes", parse=parse_bytes,
        help="the KV budget, e.g. 64MiB or 2GiB (unset: 256MiB on the CPU; on CUDA, "
             "--gpu-memory-utilization)")
    timed_cache_bytes: int | None = setting(None, low=1, parse=parse_bytes)
    gpu_memory_utilization: float = setting(
        0.9, above=0, high=1, flag="--gpu-memory-utilization", metavar="F",
        help="CUDA without --kv-cache-bytes: KV gets F x total GPU memory - weights - peak "
             "activation of one max-batched-tokens forward (docs/operations.md, GPU sizing)")
    watermark: float = setting(0.01, low=0, high=0.5, flag="--kv-watermark",
                               metavar="FRACTION",
                               help="share of KV blocks admission leaves free for running "
                                    "sequences to grow into (at most 0.5)")
    block_size: int = setting(16, low=1, flag="--block-size", help="tokens per KV block")
    cache_dtype: str = setting("auto", choices=KV_CACHE_DTYPES, flag="--kv-cache-dtype",
                               help="KV cache dtype (auto: the model's dtype)")
    scales_file: str | None = setting(None, flag="--kv-scales", metavar="FILE",
                                      help="FP8 K/V scales from python -m "
                                           "workers.model.calibrate (docs/kv-cache.md)")
    allow_unit_scales: bool = setting(False, flag="--allow-unit-kv-scales",
                                      help="start an FP8 KV cache without --kv-scales, every "
                                           "scale 1.0 (values beyond the format saturate)")
    host_cache_bytes: int = setting(0, low=0, flag="--host-cache-bytes", parse=parse_bytes,
                                    help="host-memory KV tier, e.g. 4GiB (whole blocks; 0: off, "
                                         "evicted blocks are dropped); docs/kv-cache.md")
    host_ttl_s: float | None = setting(None, above=0, flag="--host-ttl-s",
                                       help="drop host-tier entries, and the disk-tier entries "
                                            "they become, this many seconds after they "
                                            "arrived in the host tier (unset: never; needs "
                                            "--host-cache-bytes)")
    disk_cache_dir: str | None = setting(None, flag="--disk-cache-dir", metavar="DIR",
                                         help="directory of the disk KV tier below the host "
                                              "tier, kept across restarts (files under "
                                              "DIR/<namespace digest>/, one worker per "
                                              "directory); docs/kv-cache.md")
    disk_cache_bytes: int = setting(0, low=0, flag="--disk-cache-bytes", parse=parse_bytes,
                                    help="disk KV tier size, e.g. 64GiB (0: off; needs "
                                         "--disk-cache-dir and a host tier)")
    prefix_cache: bool = setting(True, flag="--no-prefix-cache",
                                 help="use the null prefix cache (nothing shared; for "
                                      "comparisons)")
    hash_algorithm: str = setting("blake2b", choices=HASH_ALGORITHMS)
    event_log_size: int = setting(65536, low=1)

    def check(self) -> None:
        """The host tier needs the prefix cache, a host TTL a host tier, the disk tier a
        directory and the host tier; a scales file needs an FP8 dtype."""
        if self.host_cache_bytes and not self.prefix_cache:
            raise FieldError("host_cache_bytes", "must be 0 without the prefix cache")
        if self.host_ttl_s is not None and not self.host_cache_bytes:
            raise FieldError("host_ttl_s", "must be unset without a host tier")
        if self.disk_cache_bytes and not self.host_cache_bytes:
            raise FieldError("disk_cache_bytes", "must be 0 without a host tier "
                             "(kv.host_cache_bytes)")
        if bool(self.disk_cache_bytes) != bool(self.disk_cache_dir):
            raise FieldError("disk_cache_dir", "kv.disk_cache_dir and kv.disk_cache_bytes "
                             "go together")
        if self.scales_file is not None and not self.cache_dtype.startswith("fp8"):
            raise FieldError("scales_file", "must be unset unless kv.cache_dtype is an FP8 dtype")


@dataclass(frozen=True)
class EngineConfig(Section, section="engine"):
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

    max_batched_tokens: int = setting(512, low=1, flag="--max-batched-tokens",
                                      help="tokens computed per engine step")
    max_num_seqs: int = setting(64, low=1, flag="--max-num-seqs",
                                help="sequences running at once")
    max_waiting_requests: int = setting(256, low=1, flag="--max-waiting-requests",
                                        help="queue bound; beyond it requests get 429")
    preemption_mode: str = setting("recompute", choices=PREEMPTION_MODES,
                                   flag="--preemption-mode",
                                   help="preempted sequences: recompute later, swap to the "
                                        "host tier, or by length")
    swap_min_tokens: int = setting(256, low=1)


@dataclass(frozen=True)
class LoraSettings(Section, section="lora"):
    """LoRA adapters, as vLLM's flags: ``enable`` (``--enable-lora``); ``modules``
    registered at start, each ``NAME=PATH`` or vLLM's JSON form
    ``{"name": ..., "path": ..., "base_model_name"?: ...}`` (``--lora-modules``);
    ``max_loras`` adapters resident in slots at once (LRU among the registered);
    ``max_lora_rank`` the rank every slot is allocated at; ``allow_runtime_updates``
    turns on ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter``
    (``--allow-runtime-lora-updates``), which read adapters only from under ``roots``
    (``--lora-root``), at most ``max_registered`` adapters in all. See
    docs/adapters.md.
    """

    enable: bool = setting(False, flag="--enable-lora",
                           help="serve LoRA adapters: slots are allocated beside the KV pool")
    modules: tuple[str, ...] = setting(
        (), flag="--lora-modules", metavar="NAME=PATH",
        help="adapters to register at start: NAME=PATH or vLLM's JSON form "
             "'{\"name\": ..., \"path\": ..., \"base_model_name\": ...}'; a misfit exits "
             "naming the field")
    max_loras: int = setting(1, low=1, flag="--max-loras",
                             help="adapters resident in slots at once, LRU among the "
                                  "registered")
    max_lora_rank: int = setting(16, low=1, flag="--max-lora-rank",
                                 help="largest adapter rank; slots are this size (a larger r "
                                      "is refused)")
    allow_runtime_updates: bool = setting(False, flag="--allow-runtime-lora-updates",
                                          help="allow POST /v1/load_lora_adapter and "
                                               "/v1/unload_lora_adapter (else 404; needs "
                                               "--lora-root)")
    roots: tuple[str, ...] = setting((), flag="--lora-root", metavar="DIR",
                                     help="the directories run-time adapter loads may read "
                                          "from (one or more)")
    max_registered: int = setting(256, low=1)

    def check(self) -> None:
        """Modules need ``enable``; each parses, and no name repeats."""
        if self.modules and not self.enable:
            raise FieldError("modules", "needs enable = true (--enable-lora)")
        if self.allow_runtime_updates and not self.enable:
            raise FieldError("allow_runtime_updates", "needs enable = true (--enable-lora)")
        if self.allow_runtime_updates and not self.roots:
            raise FieldError("roots", "run-time updates need the directories adapters may be "
                             "read from (--lora-root DIR)")
        names = [name for name, _ in self.module_paths()]
        if len(set(names)) != len(names):
            raise FieldError("modules", f"an adapter name is given twice: {names}")

    def module_paths(self) -> list[tuple[str, str]]:
        """``(name, path)`` of each entry of ``modules``."""
        return [parse_lora_module(entry) for entry in self.modules]


def parse_lora_module(entry: str) -> tuple[str, str]:
    """``(name, path)`` of one ``--lora-modules`` entry: ``NAME=PATH`` or vLLM's JSON
    object with ``name`` and ``path`` (``base_model_name`` is accepted and unused: a
    worker serves one base model). FieldError naming ``modules`` otherwise."""
    text = entry.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise FieldError("modules", f"bad JSON {entry!r}: {exc}") from None
        name, path = data.get("name"), data.get("path")
        unknown = set(data) - {"name", "path", "base_model_name"}
        if not isinstance(name, str) or not isinstance(path, str) or unknown:
            raise FieldError("modules", f"{entry!r} needs string name and path, and nothing "
                             "but base_model_name besides")
    else:
        name, _, path = text.partition("=")
    if not name or not path:
        raise FieldError("modules", f"{entry!r} is neither NAME=PATH nor a JSON object")
    return name, path


@dataclass(frozen=True)
class KVTransferConfig(Section, section="kv_transfer"):
    """Prefill/decode disaggregation (docs/pd.md), vLLM's roles: a ``kv_producer``
    prefills and holds a request's blocks for a consumer to pull from its transfer
    port ``kv_port`` (0: a free one) for at most ``timeout_s``, all holds together at
    most ``max_held_pool_fraction`` of its KV blocks and one tenant scope's at most
    ``max_scope_held_pool_fraction`` (past a cap the prefill leg is refused, 429); a
    ``kv_consumer`` pulls the blocks its own cache lacks before it decodes and
    acknowledges, waiting at most ``ack_timeout_s`` for the producer's answer;
    ``kv_both`` does either. The producer advertises ``kv_host`` (default:
    ``server.host``). A pull that fails or takes over ``pull_timeout_s`` fails its
    request (503 ``kv_transfer_failed``) unless ``fallback`` is ``recompute``."""

    kv_role: str = setting("none", choices=KV_ROLES)
    kv_port: int = setting(0, low=0, high=65535)
    kv_host: str | None = None
    timeout_s: float = setting(20.0, above=0, flag="--kv-transfer-timeout-s",
                               help="a producer holds a request's blocks at most this long "
                                    "for its consumer")
    max_held_pool_fraction: float = setting(
        0.5, above=0, high=1, flag="--kv-transfer-max-held-fraction",
        help="a producer holds at most this fraction of its KV blocks for consumers at "
             "once; past it a prefill leg is refused (429)")
    max_scope_held_pool_fraction: float = setting(
        0.25, above=0, high=1, flag="--kv-transfer-max-scope-held-fraction",
        help="and at most this fraction for one tenant scope's holds")
    pull_timeout_s: float = setting(30.0, above=0)
    ack_timeout_s: float = setting(2.0, above=0)
    fallback: str = setting("fail", choices=KV_TRANSFER_FALLBACKS, flag="--kv-transfer-fallback",
                            help="a consumer whose pull failed: fail the request (503) or "
                                 "recompute")

    @property
    def produces(self) -> bool:
        """Whether this worker prefills for others."""
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def consumes(self) -> bool:
        """Whether this worker pulls prefilled blocks."""
        return self.kv_role in ("kv_consumer", "kv_both")


@dataclass(frozen=True)
class RetentionConfig(Section, section="retention"):
    """Sessions that return (docs/kv-cache.md, "Sessions that return"): a request with
    a session id and a retention hint has its prompt's cached blocks kept ahead of LRU
    for the hinted seconds, at most ``max_retention_s``; all sessions together keep at
    most ``max_retained_pool_fraction`` of the KV blocks, one tenant scope's at most
    ``max_scope_retained_pool_fraction`` (and never past its cache quota)."""

    max_retention_s: float = setting(600.0, above=0)
    max_retained_pool_fraction: float = setting(0.25, above=0, high=1)
    max_scope_retained_pool_fraction: float = setting(0.1, above=0, high=1)


def parse_kv_transfer_config(text: str) -> dict[str, Any]:
    """vLLM's ``--kv-transfer-config`` JSON (``kv_role``, ``kv_port``, ``kv_ip``; a
    ``kv_connector`` other than ``RadixConnector`` is refused) as ``[kv_transfer]``
    fields."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise FieldError("kv_role", f"--kv-transfer-config is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise FieldError("kv_role", "--kv-transfer-config must be a JSON object")
    connector = data.pop("kv_connector", "RadixConnector")
    if connector != "RadixConnector":
        raise FieldError("kv_role", f"kv_connector {connector!r}: this worker speaks "
                                    f"RadixConnector only")
    names = {"kv_role": "kv_role", "kv_port": "kv_port", "kv_ip": "kv_host"}
    unknown = set(data) - set(names)
    if unknown:
        raise FieldError("kv_role", f"--kv-transfer-config: unknown keys {sorted(unknown)}")
    return {names[k]: v for k, v in data.items()}


@dataclass(frozen=True)
class WorkerConfig(Section):
    """The whole worker configuration, one section per component."""

    server: ServerConfig = field(default_factory=ServerConfig)
    model: ModelSettings = field(default_factory=ModelSettings)
    kv: KVSettings = field(default_factory=KVSettings)
    engine: EngineConfig = field(default_factory=EngineConfig)
    lora: LoraSettings = field(default_factory=LoraSettings)
    kv_transfer: KVTransferConfig = field(default_factory=KVTransferConfig)
    retention: RetentionConfig = field(default_factory=RetentionConfig)

    def with_overrides(self, overrides: Mapping[str, Mapping[str, Any]]) -> WorkerConfig:
        """A copy with ``{section: {field: value}}`` replaced (validated like TOML values)."""
        return read_section(WorkerConfig, overrides, "", base=self)


def load_config(path: str | Path | None) -> WorkerConfig:
    """Read a TOML file (None: all defaults). Unknown sections or keys, wrong types and
    invalid values raise ``ValueError`` naming the field."""
    if path is None:
        return WorkerConfig()
    try:
        data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ValueError(f"config {path}: {exc}") from exc
    return read_section(WorkerConfig, data, "")
