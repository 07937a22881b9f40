"""The project's version: the installed distribution's, or, when the code runs from a
plain checkout with ``PYTHONPATH`` and no install (a lent GPU machine), the version
in the source tree's ``pyproject.toml``."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

DISTRIBUTION = "radix-router"
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def project_version() -> str:
    """``radix-router``'s installed version, else the source tree's; FileNotFoundError
    when neither exists."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        with PYPROJECT.open("rb") as file:
            return str(tomllib.load(file)["project"]["version"])
