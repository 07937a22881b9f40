"""Model names resolve to files: packaged GGUFs through their distribution's file list,
paths as given, GGUF recognised by its magic bytes; errors say what to do."""

from __future__ import annotations

import pytest

from radix import model_source
from radix.model_source import PackagedModel, is_gguf, resolve_model_path


def test_a_missing_path_names_the_packaged_models():
    with pytest.raises(ValueError, match="no such file or directory .*SmolLM2-135M-Instruct"):
        resolve_model_path("/nonexistent/model")


def test_a_path_is_returned_as_given(tmp_path):
    assert resolve_model_path(str(tmp_path)) == tmp_path


def test_a_missing_distribution_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(model_source.PACKAGED_MODELS, "Tiny",
                        PackagedModel("radix-no-such-dist", "x/tiny.gguf"))
    with pytest.raises(ValueError, match="needs the package radix-no-such-dist: make install"):
        resolve_model_path("Tiny")


def test_a_distribution_without_the_file_is_named(monkeypatch):
    monkeypatch.setitem(model_source.PACKAGED_MODELS, "Tiny",
                        PackagedModel("pytest", "pytest/missing.gguf"))
    with pytest.raises(ValueError, match="pytest/missing.gguf is missing from pytest"):
        resolve_model_path("Tiny")


def test_gguf_is_recognised_by_magic_not_by_name(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"GGUF\x03\x00\x00\x00")
    (tmp_path / "fake.gguf").write_bytes(b"not a gguf")
    assert is_gguf(tmp_path / "weights.bin")
    assert not is_gguf(tmp_path / "fake.gguf") and not is_gguf(tmp_path)
