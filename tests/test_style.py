"""The tree keeps the house's lint and format rules (ruff, configured in pyproject.toml): run
``ruff check --fix . && ruff format .`` before committing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["lint", "format"])
def test_ruff_passes(command):
    pytest.importorskip("ruff", reason="ruff is a test dependency: pip install -r requirements-dev.txt")
    r = subprocess.run([sys.executable, "-m", "ruff", *command], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"ruff {' '.join(command)}:\n{r.stdout[-5000:]}{r.stderr[-2000:]}"
