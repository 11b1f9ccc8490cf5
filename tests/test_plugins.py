"""The plugin host: entry-point discovery of a third-party package, the POOT_PLUGINS filter, and a
broken plugin reported by name without stopping the others."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from poot.plugins import host

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def third_party(tmp_path_factory) -> Path:
    """tests/plugins/poot-example and poot-broken installed into a fresh target directory."""
    target = tmp_path_factory.mktemp("site")
    for pkg in ("poot-example", "poot-broken"):
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--target", str(target), str(HERE / "plugins" / pkg)],
            check=True,
        )
    return target


def poot(*args: str, site: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.pop("POOT_PLUGINS", None)
    if site is not None:
        e["PYTHONPATH"] = os.pathsep.join([str(site)] + ([e["PYTHONPATH"]] if e.get("PYTHONPATH") else []))
    e.update(env)
    return subprocess.run([sys.executable, "-m", "poot.cli", *args], capture_output=True, text=True, env=e, timeout=120)


def test_core_registers_its_quantizations_through_the_hook():
    infos = {i.name: i for i in host().infos}
    assert infos["poot.core"].status == "loaded"
    from poot.quant import quantizations

    assert {"f32", "f16", "bf16", "q4_0", "q8_0"} <= set(quantizations())


def test_third_party_device_and_family_are_discovered(third_party):
    r = poot("devices", "--json", site=third_party)
    assert r.returncode == 0, r.stderr
    devs = {d["name"]: d for d in json.loads(r.stdout)}
    assert devs["example:0"]["plugin"] == "example"
    assert devs["example:0"]["reason"] == {"code": "no-device", "message": "the example plugin has no hardware"}
    code = "from poot.models import family_for; f = family_for('ExampleForCausalLM'); print(f.name, f.gguf_architectures)"
    e = dict(os.environ, PYTHONPATH=str(third_party))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, check=True).stdout
    assert out.strip() == "example ('example-arch',)"


def test_broken_plugins_are_reported_by_name_and_others_still_load(third_party):
    r = poot("plugins", "--json", site=third_party)
    assert r.returncode == 0, r.stderr
    infos = {i["name"]: i for i in json.loads(r.stdout)}
    assert infos["broken"]["status"] == "failed"
    assert "ModuleNotFoundError" in infos["broken"]["error"] and "poot_broken_missing_dependency" in infos["broken"]["error"]
    assert infos["badhook"]["status"] == "failed"
    assert "poot_executor" in infos["badhook"]["error"] and "dev" in infos["badhook"]["error"]
    assert infos["typohook"]["status"] == "failed"  # pluggy's check_pending, per plugin, with the nearest hook
    assert infos["typohook"]["error"] == "it implements 'poot_exectuor', which is no poot hook (did it mean 'poot_executor'?)"
    assert infos["example"]["status"] == "loaded"
    table = poot("plugins", site=third_party).stdout
    assert "broken" in table and "failed" in table


def test_poot_plugins_restricts_what_loads(third_party):
    r = poot("plugins", "--json", site=third_party, POOT_PLUGINS="example")
    infos = {i["name"]: i for i in json.loads(r.stdout)}
    assert infos["example"]["status"] == "loaded"
    assert infos["broken"]["status"] == "filtered"
    assert all(i["status"] == "filtered" for n, i in infos.items() if n not in ("example", "poot.core"))
    devs = json.loads(poot("devices", "--json", site=third_party, POOT_PLUGINS="example").stdout)
    assert [d["name"] for d in devs] == ["example:0", "excpu:0"]


def test_unknown_architecture_lists_installed_families(third_party):
    code = "from poot.models import family_for\ntry:\n    family_for('NoSuchForCausalLM')\nexcept Exception as e:\n    print(type(e).__name__, e)"
    e = dict(os.environ, PYTHONPATH=str(third_party))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, check=True).stdout
    assert out.startswith("UnknownArchitecture") and "example (example-arch, ExampleForCausalLM) from example" in out
    assert "poot_model_families" in out


def test_a_third_party_backend_brings_its_own_target(third_party):
    """tests/plugins/poot-example adds a device whose kernels compile for a target of its own (x86-64-v3,
    not the host's own CPU model) through poot_codegen_target and run through its
    poot_kernel_runner, using the backend SDK alone: the host kernel suite's RMSNorm, softmax and
    GEMV cases pass on it against the oracle, and a model is planned for it."""
    code = (
        "from poot.plugins import host; from poot.runtime import get_device; d = get_device('excpu:0'); "
        "t = host().hook.poot_codegen_target(device=d); print(t.key)"
    )
    e = dict(os.environ, PYTHONPATH=str(third_party))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, timeout=120)
    assert out.returncode == 0 and out.stdout.split()[0] == "host:x86-64-v3", out.stdout + out.stderr
    suite = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            "--import-mode=importlib",
            str(HERE / "test_kernels_host.py"),
            "-k",
            "rms_norm or softmax or gemv",
        ],
        capture_output=True,
        text=True,
        env={**e, "POOT_TEST_DEVICE": "excpu:0"},
        timeout=900,
        cwd=HERE.parent,
    )
    tail = suite.stdout.strip().splitlines()[-1]
    assert suite.returncode == 0 and " passed" in tail and "failed" not in tail, suite.stdout[-2000:] + suite.stderr[-2000:]
    plan = poot("plan", "SmolLM2", "--device", "excpu:0", "--compile", site=third_party)
    assert plan.returncode == 0 and "compiled" in plan.stdout and "for host:" in plan.stdout, plan.stderr


def test_a_third_party_family_brings_its_names_config_and_template(third_party, tmp_path, rng):
    """tests/plugins/poot-example's family, written against ``poot.models`` alone: a checkpoint with
    its own architecture, config.json keys and tensor names maps every tensor to a role, and runs on
    the oracle to the very logits of the same weights under transformers' Llama names (the roles are
    the model); its chat template renders a conversation."""
    seed = int(rng.integers(0, 2**31))
    e = dict(os.environ, PYTHONPATH=str(third_party))
    r = subprocess.run(
        [sys.executable, str(HERE / "plugins" / "example_family_check.py"), str(tmp_path), str(seed)], capture_output=True, text=True, env=e, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    assert report["family"] == "example" and report["unknown"] == [] and report["roles"] == 3 + 2 * 9
    assert report["finite"] and report["max_diff"] == 0.0, report
    assert report["chat"] == "[user] hi\n[assistant] ", report["chat"]
