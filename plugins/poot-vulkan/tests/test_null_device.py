"""null:vulkan: plans and SPIR-V for a desktop Vulkan 1.3 GPU on a machine without one."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


def _poot(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "poot.cli", *args], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("model", ["SmolLM2", "gemma3"])
def test_poot_plan_compiles_real_models_for_vulkan(smollm2_path, gemma3_path, model):
    r = _poot("plan", model, "--device", "null:vulkan", "--compile")
    assert r.returncode == 0, r.stderr
    m = re.search(r"compiled (\d+) kernels for spirv:subgroup32 in [\d.]+ s: [\d.]+ (KiB|MiB) of spirv", r.stdout)
    assert m and int(m.group(1)) > 10, r.stdout[-500:]
    r = _poot("plan", model, "--device", "null:vulkan", "--tokens", "8")
    assert r.returncode == 0 and "tokens=8" in r.stdout and "activation arena" in r.stdout, r.stderr
