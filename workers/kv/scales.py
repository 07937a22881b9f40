"""FP8 KV scales per channel, K offsets, and the calibration record they come from.

An FP8 cache stores ``(k - k_offset) / k_scale`` and ``v / v_scale`` (saturated to the
format's range), with a scale per layer, KV head and channel (head dim) for K and for
V and an offset per K channel, and attention reads ``k_hat * k_scale + k_offset`` and
``v_hat * v_scale``. None of it costs attention a pass over the keys
(``workers.attention.reference``): a K offset shifts every score of one query by the
same ``q . k_offset``, which softmax ignores, so it is never read back; a K scale
multiplies the query once, a V scale the output once. Why channels and K offsets (the
per-layer scales before them lost 7 of the quality gate's 9 buckets), and why no V
offset: docs/kv-cache.md.

A calibration record (``workers.model.calibrate``) holds, per layer and channel, the
mean of K over a prompt set (the offset), the largest distance of K from it
(``k_amax``) and the largest ``|V|`` (``v_amax``), the weights digest, the tool's name,
version and parameters (``headroom`` among them), the prompt set's sha256 and a sha256
of its own canonical content. A channel's scale is ``headroom * amax`` over the
format's largest finite value, so one record serves both FP8 formats and values a
little beyond the calibrated range do not saturate. Without a record every layer is
unit (``KVScales.unit``: offset 0, scale 1), which a worker allows only with
``--allow-unit-kv-scales``.

The record's sha256 (``KVScales.digest``) enters the namespace's ``kv_scales_digest``:
two pools quantized differently never share a cached block, and a record of this
format never has the digest of one of the per-layer format before it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

FORMAT = "radix-router-kv-scales/2"
PER_LAYER_FORMAT = "radix-router-kv-scales/1"
UNIT_SOURCE = "unit"
STATS = ("k_offset", "k_amax", "v_amax")
_MIN_AMAX = 1e-6


class LayerScales(NamedTuple):
    """One layer's FP8 scales and K offsets, each ``[num_kv_heads, head_dim]`` float32:
    the cache stores ``(k - k_offset) / k_scale`` and ``v / v_scale``."""

    k_scale: torch.Tensor
    k_offset: torch.Tensor
    v_scale: torch.Tensor

    def to(self, device: torch.device) -> LayerScales:
        """The same scales on ``device``."""
        return LayerScales(*(t.to(device) for t in self))


@dataclass(frozen=True, eq=False)
class KVScales:
    """Per layer, its ``LayerScales`` (None: unit, the cache stores K and V as they
    are); ``source`` is the record they came from (or ``unit``), ``digest`` its sha256
    ("" for unit). Two are equal when their source and digest are."""

    layers: tuple[LayerScales | None, ...]
    source: str = UNIT_SOURCE
    digest: str = ""

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError("KVScales needs at least one layer")
        for layer in self.layers:
            if layer is not None and not (bool((layer.k_scale > 0).all())
                                          and bool((layer.v_scale > 0).all())):
                raise ValueError("KVScales' scales must all be positive")

    @classmethod
    def unit(cls, num_layers: int) -> KVScales:
        """Every layer unit: the cache stores K and V as they are (non-FP8 caches too)."""
        return cls((None,) * num_layers)

    @property
    def num_layers(self) -> int:
        """Layers covered."""
        return len(self.layers)

    @property
    def is_unit(self) -> bool:
        """Whether every layer stores K and V as they are."""
        return all(layer is None for layer in self.layers)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, KVScales) and self.num_layers == other.num_layers
                and (self.source, self.digest) == (other.source, other.digest))

    def __hash__(self) -> int:
        return hash((self.num_layers, self.source, self.digest))

    def describe(self) -> str:
        """One line for logs and ``/info``: the source and, for a record, its digest."""
        if self.source == UNIT_SOURCE:
            return "unit scales (no calibration file)"
        return f"{self.source} (per-channel, sha256 {self.digest[:16]})"


def fp8_max(dtype: str) -> float:
    """Largest finite value of an FP8 dtype (448 for e4m3fn, 57344 for e5m2)."""
    return float(torch.finfo(getattr(torch, dtype)).max)


def content_digest(record: Mapping[str, object]) -> str:
    """sha256 of a calibration record's canonical JSON, without its ``sha256`` field."""
    body = {key: value for key, value in record.items() if key != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def calibration_record(
    model_digest: str, tool: Mapping[str, object], prompts: Mapping[str, object],
    layers: Sequence[Mapping[str, torch.Tensor]],
) -> dict[str, object]:
    """The JSON object a calibration run writes, its ``sha256`` included. ``tool``:
    the tool's name, version and parameters (``headroom`` among them); ``prompts``:
    the prompt set's file name, sha256 and counts; ``layers``: per layer the
    ``STATS`` tensors ``[num_kv_heads, head_dim]``, written to 6 significant digits."""
    record: dict[str, object] = {
        "format": FORMAT,
        "tool": dict(tool),
        "model_digest": model_digest,
        "prompts": dict(prompts),
        "layers": [{name: _rounded(layer[name]) for name in STATS} for layer in layers],
    }
    record["sha256"] = content_digest(record)
    return record


def load_scales(path: str | Path, dtype: str, num_layers: int, num_kv_heads: int,
                head_dim: int, model_digest: str) -> KVScales:
    """Scales for ``dtype`` from a calibration file. ValueError when the file is not a
    record of this format (a per-layer record of the format before says to
    recalibrate), its sha256 does not match its content, it was recorded for other
    weights, or its shape is not this model's."""
    record = _read(path)
    if record.get("sha256") != content_digest(record):
        raise ValueError(f"kv scales file {path}: sha256 does not match its content")
    if record.get("model_digest") != model_digest:
        raise ValueError(
            f"kv scales file {path} was calibrated for weights {record.get('model_digest')!r},"
            f" this model is {model_digest!r}"
        )
    headroom = _headroom(record, path)
    layers = record.get("layers")
    if not isinstance(layers, list) or len(layers) != num_layers:
        raise ValueError(f"kv scales file {path}: needs {num_layers} layers")
    top = fp8_max(dtype)
    parsed = []
    for index, layer in enumerate(layers):
        stats = _layer_stats(layer, (num_kv_heads, head_dim), f"kv scales file {path} layer {index}")
        parsed.append(LayerScales(
            stats["k_amax"].clamp(min=_MIN_AMAX) * (headroom / top), stats["k_offset"],
            stats["v_amax"].clamp(min=_MIN_AMAX) * (headroom / top)))
    return KVScales(tuple(parsed), str(path), str(record["sha256"]))


def _read(path: str | Path) -> dict[str, Any]:
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"kv scales file {path}: {exc}") from exc
    found = record.get("format") if isinstance(record, dict) else None
    if found == PER_LAYER_FORMAT:
        raise ValueError(f"kv scales file {path} holds per-layer scales ({found}), which "
                         "this engine no longer reads: recalibrate with python -m "
                         "workers.model.calibrate")
    if found != FORMAT:
        raise ValueError(f"kv scales file {path}: not a {FORMAT} record")
    return record


def _headroom(record: Mapping[str, Any], path: str | Path) -> float:
    tool = record.get("tool")
    parameters = tool.get("parameters") if isinstance(tool, dict) else None
    headroom = parameters.get("headroom") if isinstance(parameters, dict) else None
    if not isinstance(headroom, (int, float)) or isinstance(headroom, bool) or headroom < 1:
        raise ValueError(f"kv scales file {path}: tool.parameters.headroom must be a number "
                         ">= 1")
    return float(headroom)


def _layer_stats(layer: object, shape: tuple[int, int], where: str) -> dict[str, torch.Tensor]:
    """A record layer's ``STATS`` as float32 tensors of ``shape``; ValueError otherwise."""
    if not isinstance(layer, dict):
        raise ValueError(f"{where}: not an object")
    stats = {}
    for name in STATS:
        try:
            tensor = torch.tensor(layer[name], dtype=torch.float32)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{where}: no valid {name}") from exc
        if tuple(tensor.shape) != shape or not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{where}: {name} must be {shape[0]} x {shape[1]} finite numbers")
        stats[name] = tensor
    if bool((stats["k_amax"] < 0).any() or (stats["v_amax"] < 0).any()):
        raise ValueError(f"{where}: k_amax and v_amax must not be negative")
    return stats


def _rounded(tensor: torch.Tensor) -> list[list[float]]:
    return [[float(f"{x:.6g}") for x in row] for row in tensor.tolist()]
