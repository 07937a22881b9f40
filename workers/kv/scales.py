"""Per-layer K and V scales of an FP8 KV cache, and the calibration file they come from.

An FP8 cache stores ``x / scale`` (saturated to the format's range) and attention
reads ``stored * scale``. A calibration file (written by ``workers.model.calibrate``)
records, per layer, the largest absolute K and V value seen over a prompt set, the
model's weights digest, the prompt set's digest and a sha256 of its own canonical
content; the scale of a layer is that maximum over the format's largest finite
value, so the calibrated range maps onto the whole FP8 range. One file serves both
FP8 formats. Without a file every scale is 1.0 (``KVScales.unit``), and the worker
warns: values beyond the format's range then saturate.

The file's sha256 (``KVScales.digest``) enters the namespace's ``kv_format``: two
pools quantized with different scales never share a cached block.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

FORMAT = "radix-router-kv-scales/1"
UNIT_SOURCE = "unit"
_MIN_AMAX = 1e-6


@dataclass(frozen=True)
class KVScales:
    """``k_scales[layer]`` and ``v_scales[layer]`` for one cache dtype; ``source`` is the
    file they came from (or ``unit``), ``digest`` its recorded sha256 ("" for unit)."""

    k_scales: tuple[float, ...]
    v_scales: tuple[float, ...]
    source: str = UNIT_SOURCE
    digest: str = ""

    def __post_init__(self) -> None:
        if len(self.k_scales) != len(self.v_scales) or not self.k_scales:
            raise ValueError("KVScales needs one K and one V scale per layer")
        if not all(s > 0 for s in (*self.k_scales, *self.v_scales)):
            raise ValueError("KVScales must all be positive")

    @classmethod
    def unit(cls, num_layers: int) -> KVScales:
        """Every scale 1.0: the cache stores K and V as they are (non-FP8 caches too)."""
        return cls((1.0,) * num_layers, (1.0,) * num_layers)

    @property
    def num_layers(self) -> int:
        """Layers covered."""
        return len(self.k_scales)

    def describe(self) -> str:
        """One line for logs and ``/info``: the source and, for a file, its digest."""
        if self.source == UNIT_SOURCE:
            return "unit scales (no calibration file)"
        return f"{self.source} (sha256 {self.digest[:16]})"


def fp8_max(dtype: str) -> float:
    """Largest finite value of an FP8 dtype (448 for e4m3fn, 57344 for e5m2)."""
    return float(torch.finfo(getattr(torch, dtype)).max)


def content_digest(record: Mapping[str, object]) -> str:
    """sha256 of a calibration record's canonical JSON, without its ``sha256`` field."""
    body = {key: value for key, value in record.items() if key != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def calibration_record(
    model_digest: str, prompts_digest: str, k_amax: Sequence[float], v_amax: Sequence[float]
) -> dict[str, object]:
    """The JSON object a calibration run writes, its ``sha256`` included."""
    record: dict[str, object] = {
        "format": FORMAT,
        "model_digest": model_digest,
        "prompts_digest": prompts_digest,
        "k_amax": [float(x) for x in k_amax],
        "v_amax": [float(x) for x in v_amax],
    }
    record["sha256"] = content_digest(record)
    return record


def load_scales(path: str | Path, dtype: str, num_layers: int, model_digest: str) -> KVScales:
    """Scales for ``dtype`` from a calibration file. ValueError when the file is not a
    calibration record, its sha256 does not match its content, it was recorded for
    other weights, or its layer count differs."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"kv scales file {path}: {exc}") from exc
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"kv scales file {path}: not a {FORMAT} record")
    if record.get("sha256") != content_digest(record):
        raise ValueError(f"kv scales file {path}: sha256 does not match its content")
    if record.get("model_digest") != model_digest:
        raise ValueError(
            f"kv scales file {path} was calibrated for weights {record.get('model_digest')!r},"
            f" this model is {model_digest!r}"
        )
    k_amax, v_amax = record.get("k_amax"), record.get("v_amax")
    if not (isinstance(k_amax, list) and isinstance(v_amax, list)) or not (
        len(k_amax) == len(v_amax) == num_layers
    ):
        raise ValueError(f"kv scales file {path}: needs {num_layers} K and V maxima")
    top = fp8_max(dtype)
    return KVScales(
        tuple(max(float(a), _MIN_AMAX) / top for a in k_amax),
        tuple(max(float(a), _MIN_AMAX) / top for a in v_amax),
        str(path),
        str(record["sha256"]),
    )
