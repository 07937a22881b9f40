"""Load a Llama-family model, its tokenizer and a weights digest from local files.

Two formats: a Hugging Face directory, or a GGUF file (``workers.model.gguf_weights``:
config and tokenizer from its metadata, tensors dequantized at load). A directory
holds config.json, tokenizer.json (+ optional tokenizer_config.json,
chat_template.jinja, generation_config.json), and weights as ``model.safetensors``
or shards listed by ``model.safetensors.index.json``. Every tensor the model needs
is checked by name, shape and file before the model is built; a problem raises
ValueError naming the file and tensor.

``weights_digest`` is a SHA-256 over the config and the full bytes of every weight
file (not just headers: two fine-tunes of one architecture have identical headers,
and their KV blocks must never be shared); for a GGUF that is the whole file.
Files are hashed in parallel threads; expect about a second per GB per core.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from radix.model_source import is_gguf
from radix.tokenizer import PromptTokenizer
from workers.model.config import ModelConfig
from workers.model.gguf_weights import GGUFCheckpoint
from workers.model.llama import LlamaForCausalLM

_DIGEST_DOMAIN = b"radix-router/weights/v1"
_INDEX_FILE = "model.safetensors.index.json"
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass(frozen=True)
class LoadedModel:
    """A ready model (eval mode, on its device) with everything that identifies it."""

    path: Path
    config: ModelConfig
    model: LlamaForCausalLM
    tokenizer: PromptTokenizer
    weights_digest: str


def load_model(
    path: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype | None = None
) -> LoadedModel:
    """Load the HF directory or GGUF file ``path`` onto ``device`` in ``dtype`` (default:
    the config's). Raises ValueError naming the offending file or tensor."""
    root = Path(path)
    if is_gguf(root):
        return _load_gguf(root, device, dtype)
    if not root.is_dir():
        raise ValueError(f"{root}: neither a model directory nor a GGUF file")
    config = ModelConfig.from_file(root / "config.json")
    tokenizer = PromptTokenizer.from_dir(root)
    _check_vocab(tokenizer, config, root / "tokenizer.json")
    files = weight_files(root)
    model = _meta_model(config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    located = _locate_tensors(files, expected, config.tie_word_embeddings)
    state = {}
    for file, names in _group_by_file(located).items():
        with safe_open(file, framework="pt") as handle:
            for name in names:
                state[name] = handle.get_tensor(name).to(device=device, dtype=dtype or config.dtype)
    config_file = root / "config.json"
    digest = weights_digest(files, config_file.read_bytes())
    return LoadedModel(root, config, _assemble(model, state, config), tokenizer, digest)


def _load_gguf(path: Path, device: torch.device | str, dtype: torch.dtype | None) -> LoadedModel:
    checkpoint = GGUFCheckpoint.open(path)
    try:
        config = ModelConfig.from_dict(checkpoint.config_fields)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc
    _check_vocab(checkpoint.tokenizer, config, path)
    model = _meta_model(config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    state = checkpoint.state_dict(expected, dtype or config.dtype, device)
    digest = weights_digest([path], b"")
    return LoadedModel(path, config, _assemble(model, state, config), checkpoint.tokenizer, digest)


def _meta_model(config: ModelConfig) -> LlamaForCausalLM:
    with torch.device("meta"):
        return LlamaForCausalLM(config)


def _assemble(
    model: LlamaForCausalLM, state: Mapping[str, torch.Tensor], config: ModelConfig
) -> LlamaForCausalLM:
    """Put ``state`` into the meta ``model`` (tying the head if the config says so); on
    CUDA, merge its q/k/v and gate/up projections (``LlamaForCausalLM.merge_projections``)."""
    state = dict(state)
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    if model.lm_head.weight.is_cuda:
        model.merge_projections()
    return model.eval()


def _check_vocab(tokenizer: PromptTokenizer, config: ModelConfig, where: Path) -> None:
    if tokenizer.vocab_size > config.vocab_size:
        raise ValueError(
            f"{where}: {tokenizer.vocab_size} tokens exceed vocab_size {config.vocab_size} "
            "of the model"
        )


def weight_files(root: Path) -> list[Path]:
    """The safetensors files of a checkpoint: those named by the shard index if there
    is one, else ``model.safetensors``. ValueError naming what is missing."""
    index_file = root / _INDEX_FILE
    if index_file.is_file():
        try:
            weight_map = json.loads(index_file.read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{index_file}: invalid shard index: {exc}") from exc
        files = sorted({root / name for name in weight_map.values()})
        for file in files:
            if not file.is_file():
                raise ValueError(f"{index_file}: shard {file.name} does not exist")
        return files
    single = root / "model.safetensors"
    if not single.is_file():
        raise ValueError(f"{single}: missing weights (and no {_INDEX_FILE})")
    return [single]


def weights_digest(files: Iterable[Path], config_bytes: bytes) -> str:
    """Hex SHA-256 over the config's bytes and each weight file's name and full-content
    hash (a GGUF's config is inside the file: ``config_bytes`` is then empty)."""
    files = sorted(files, key=lambda f: f.name)
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(files)))) as pool:
        file_hashes = list(pool.map(_file_sha256, files))
    fields = [_DIGEST_DOMAIN, config_bytes]
    for file, file_hash in zip(files, file_hashes, strict=True):
        fields += [file.name.encode(), file_hash]
    return hashlib.sha256(b"".join(len(f).to_bytes(8, "big") + f for f in fields)).hexdigest()


def _locate_tensors(
    files: list[Path], expected: dict[str, tuple[int, ...]], tied: bool
) -> dict[str, Path]:
    """Map each needed tensor to its file, checking presence, uniqueness and shape."""
    located: dict[str, Path] = {}
    for file in files:
        try:
            with safe_open(file, framework="pt") as handle:
                for name in handle.keys():  # noqa: SIM118 (safe_open is not a Mapping)
                    if name.endswith(_IGNORED_SUFFIXES) or (tied and name == "lm_head.weight"):
                        continue
                    if name not in expected:
                        raise ValueError(f"{file}: unexpected tensor {name!r}")
                    if name in located:
                        raise ValueError(f"{file}: tensor {name!r} also in {located[name].name}")
                    shape = tuple(handle.get_slice(name).get_shape())
                    if shape != expected[name]:
                        raise ValueError(
                            f"{file}: tensor {name!r} has shape {shape}, config.json implies "
                            f"{expected[name]}"
                        )
                    located[name] = file
        except SafetensorError as exc:
            raise ValueError(f"{file}: invalid safetensors file: {exc}") from exc
    needed = [n for n in expected if not (tied and n == "lm_head.weight")]
    missing = [name for name in needed if name not in located]
    if missing:
        where = ", ".join(f.name for f in files)
        raise ValueError(f"{files[0].parent}: tensor {missing[0]!r} missing from {where}")
    return located


def _group_by_file(located: dict[str, Path]) -> dict[Path, list[str]]:
    groups: dict[Path, list[str]] = {}
    for name, file in located.items():
        groups.setdefault(file, []).append(name)
    return groups


def _file_sha256(path: Path) -> bytes:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 24):
            digest.update(chunk)
    return digest.digest()
