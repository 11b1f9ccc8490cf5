"""`poot check` on the CPU: every part passes with its results written as JSON, and a kernel broken on
purpose (a packed type's dequantization off by a little) fails the check with the case named."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from poot.models.family import model_families


def _check(*args: str, prelude: str = "") -> subprocess.CompletedProcess:
    code = textwrap.dedent(prelude) + "\nimport sys\nfrom poot.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.run([sys.executable, "-c", code, "check", *args], capture_output=True, text=True, timeout=900)


def test_poot_check_passes_on_the_cpu(smollm2_path, tmp_path):
    r = _check("--device", "cpu", "--out", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((tmp_path / "check.json").read_text())
    assert doc["device"] == "cpu" and doc["passed"] is True
    by_part: dict[str, list[dict]] = {}
    for c in doc["results"]:
        by_part.setdefault(c["part"], []).append(c)
        assert c["status"] == "pass", c
    assert len(by_part["kernels"]) >= 18 and any(c["case"] == "matmul q4_k" for c in by_part["kernels"])
    families = {f.name for _, f in model_families()}
    assert {c["case"].removesuffix(" family") for c in by_part["models"]} == families
    greedy = next(c for c in by_part["checkpoint"] if c["case"].endswith("greedy tokens"))
    assert "96 greedy tokens, each the oracle's choice" in greedy["detail"]
    bench = by_part["bench"][0]["figures"]
    assert bench["decode_b1"] > 0 and bench["prefill_b4"] > 0
    assert "all 26 cases passed" in r.stdout  # the table's verdict line, then the file
    assert r.stdout.splitlines()[0].split() == ["PART", "CASE", "RESULT", "SECONDS", "DETAIL"]


def test_poot_check_fails_naming_a_broken_kernel(tmp_path):
    """The Q5_K dequantization body every kernel that reads Q5_K weights instantiates, off by one
    part in a hundred: they compute wrong products, and the check says which case. (Q4_K's products
    on the CPU sum its quants in integers, without the body.)"""
    broken = """
    from poot.kernel import ir
    from poot.graph import dtypes as dt
    from poot.quant import bodies
    size, nbytes, body = bodies.BODIES["q5_k"]
    bodies.BODIES["q5_k"] = (size, nbytes, lambda b, p, j, lut: ir.Bin("mul", body(b, p, j, lut), ir.Const(1.01, dt.f32)))
    """
    r = _check("--device", "cpu", "--only", "kernels", "--out", str(tmp_path), prelude=broken)  # (--quick has no Q5_K case)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAILED kernels: matmul q5_k: 1 rows: output y is" in r.stdout
    doc = json.loads((tmp_path / "check.json").read_text())
    failed = {c["case"] for c in doc["results"] if c["status"] == "fail"}
    assert failed == {"matmul q5_k"}, failed
    assert doc["passed"] is False
