"""The project's version from an install and from a plain checkout (``radix.version``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from radix.version import project_version

ROOT = Path(__file__).resolve().parents[2]
SOURCE_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

# A copy of the tree without its build files, run without site-packages (python -S):
# no distribution is installed, as on a machine that runs the tree with PYTHONPATH only.
PLAIN_CHECKOUT = """
import importlib.metadata
try:
    importlib.metadata.version("radix-router")
    print("installed")
except importlib.metadata.PackageNotFoundError:
    from radix.version import project_version
    print(project_version())
"""


def test_the_installed_version_is_the_source_trees() -> None:
    assert project_version() == SOURCE_VERSION


def test_a_plain_checkout_without_an_install_reads_the_source_trees_version(tmp_path) -> None:
    shutil.copytree(ROOT / "radix", tmp_path / "radix")
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    out = subprocess.run([sys.executable, "-S", "-c", PLAIN_CHECKOUT],
                         env={"PYTHONPATH": str(tmp_path)}, cwd=tmp_path, capture_output=True, text=True,
                         check=True, timeout=60).stdout.strip()
    assert out == SOURCE_VERSION
