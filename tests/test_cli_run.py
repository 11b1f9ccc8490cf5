"""The CLI on a real model: `poot run` (greedy answer, constrained output, bad flags), `poot bench`
and `poot chat` driven through a pipe."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def _poot(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "poot.cli", *args], capture_output=True, text=True, timeout=600, input=stdin)


@pytest.mark.slow
def test_poot_run_answers_with_smollm2(smollm2_path):
    r = _poot("run", "SmolLM2", "What is the capital of France?", "--max-tokens", "8")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
    assert "ready in" in r.stderr and "prompt tokens" in r.stderr and "tok/s" in r.stderr


def test_poot_run_with_a_json_schema(smollm2_path, tmp_path):
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"], "additionalProperties": False}
    f = tmp_path / "schema.json"
    f.write_text(json.dumps(schema))
    r = _poot("run", "SmolLM2", "Is the sky blue? Answer in JSON.", "--json-schema", str(f), "--max-tokens", "20", "--temperature", "0.7", "--seed", "3")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["answer"] in ("yes", "no")


def test_bad_flags_are_errors_that_name_the_flag(smollm2_path, tmp_path):
    r = _poot("run", "SmolLM2", "hi", "--top-p", "1.5")
    assert r.returncode == 1 and "top_p" in r.stderr and "Traceback" not in r.stderr
    r = _poot("run", "SmolLM2", "hi", "--json-schema", str(tmp_path / "missing.json"))
    assert r.returncode == 1 and "--json-schema" in r.stderr
    r = _poot("run", "SmolLM2", "hi", "--kv-memory", "lots")
    assert r.returncode == 1 and "kv_memory" in r.stderr


def test_poot_bench_prints_a_table(smollm2_path):
    r = _poot("bench", "SmolLM2", "--batch", "1", "2", "--prompt-tokens", "16", "--decode-tokens", "4", "--rounds", "1")
    assert r.returncode == 0, r.stderr
    lines = [l.split() for l in r.stdout.splitlines() if l.startswith("poot ")]
    assert [l[1] for l in lines] == ["1", "2"] and all(float(l[2]) > 0 and float(l[3]) > 0 for l in lines)


def test_poot_chat_through_a_pipe(smollm2_path):
    r = _poot("chat", "SmolLM2", "--temperature", "0", "--max-tokens", "12", stdin="What is the capital of France?\n\n")
    assert r.returncode == 0, r.stderr
    assert "Paris" in r.stdout
