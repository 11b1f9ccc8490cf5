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
    assert "\r" not in r.stderr and "compiling kernels" not in r.stderr  # a pipe gets lines, not a progress bar


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


@pytest.mark.parametrize(
    "args,flag",
    [
        (["serve", "SmolLM2", "--port", "99999"], "--port"),
        (["run", "SmolLM2", "hi", "--context", "5"], "--context"),
        (["run", "SmolLM2", "hi", "--context", "-3"], "--context"),
        (["run", "SmolLM2", "hi", "--context", "0"], "--context"),
        (["serve", "SmolLM2", "--max-batch", "0"], "--max-batch"),
        (["serve", "SmolLM2", "--max-queue", "x"], "--max-queue"),
    ],
)
def test_a_bad_flag_is_named_before_the_model_loads(args, flag):
    """A bad number is refused by the flag that carries it, in one line, before anything loads (they
    had blamed --kv-memory, become 4096 silently, or come after the model loaded as tracebacks)."""
    r = _poot(*args)
    assert r.returncode == 2 and f"argument {flag}:" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "loading" not in r.stderr


def test_serve_on_a_port_in_use_says_so_before_loading():
    import socket

    with socket.create_server(("127.0.0.1", 0)) as s:
        r = _poot("serve", "SmolLM2", "--port", str(s.getsockname()[1]))
    assert r.returncode == 1 and "cannot serve on 127.0.0.1:" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "serving" not in r.stdout and "loading" not in r.stderr


def test_contexts_and_kv_memory_beyond_what_the_model_or_machine_has(smollm2_path):
    """A context past the model's trained length (SmolLM2: 8192) runs with a one-line warning; one
    that the KV pool cannot hold for even one sequence, and a --kv-memory beyond the machine's free
    memory, are errors naming the flag (both had been accepted silently: --context 100000000 held
    about 267k positions, --kv-memory 1T was taken on a 24 GiB machine)."""
    r = _poot("run", "SmolLM2", "hi", "--raw", "--context", "9000", "--max-tokens", "2")
    assert r.returncode == 0 and "poot: warning: a context of 9000 is past the 8192 positions" in r.stderr, r.stderr
    r = _poot("run", "SmolLM2", "hi", "--context", "100000000", "--max-tokens", "2")
    assert r.returncode == 1 and "max_context: a context of 100000000 needs" in r.stderr and "smaller --context" in r.stderr, r.stderr
    r = _poot("run", "SmolLM2", "hi", "--kv-memory", "1T", "--max-tokens", "2")
    assert r.returncode == 1 and "kv_memory: 1024.0 GiB is more than the" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_a_long_prompt_shows_progress_on_a_terminal_only(smollm2_path):
    """Reading a long prompt shows a bar on a terminal (a 6,000-token prompt had shown nothing for
    minutes); through a pipe the same run writes no bar and no carriage return."""
    import fcntl
    import os
    import pty
    import struct
    import termios

    prompt = " ".join(f"w{i}" for i in range(600))  # about 2,100 tokens: five 512-token steps, seconds past the bar's one-second delay
    args = [sys.executable, "-m", "poot.cli", "run", "SmolLM2", prompt, "--raw", "--max-tokens", "1", "--context", "4096"]
    main, sub = pty.openpty()
    fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a new pty is 0 columns wide: no room for a bar
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=sub, stdin=subprocess.DEVNULL)
    os.close(sub)
    seen = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the other end closed
            break
        if not chunk:
            break
        seen += chunk
    os.close(main)
    assert proc.wait(timeout=600) == 0, seen.decode(errors="replace")
    assert b"poot: reading the prompt" in seen and b"token" in seen, seen.decode(errors="replace")
    piped = _poot("run", "SmolLM2", prompt, "--raw", "--max-tokens", "1", "--context", "4096")
    assert piped.returncode == 0 and "reading the prompt" not in piped.stderr and "\r" not in piped.stderr, piped.stderr


def test_chat_template_flag_takes_a_file_or_the_family_template(gemma3_path, tmp_path):
    """Gemma 3 270M has no template: chat refuses, --chat-template family gives the family's, a file
    gives its own (the prompt grows by the template's words), a missing file is an error naming the
    flag."""
    import re

    r = _poot("chat", "gemma3", "--max-tokens", "2", stdin="Hi\n\n")
    assert r.returncode == 1 and "has no chat template" in r.stderr, r.stderr
    r = _poot("chat", "gemma3", "--chat-template", "family", "--max-tokens", "2", "--temperature", "0", stdin="Hi\n\n")
    assert r.returncode == 0, r.stderr
    f = tmp_path / "t.jinja"
    f.write_text("{% for m in messages %}Q: {{ m.content }}\n{% endfor %}A:")
    r = _poot("run", "gemma3", "Say yes", "--chat-template", str(f), "--max-tokens", "2", "--temperature", "0")
    raw = _poot("run", "gemma3", "Say yes", "--raw", "--max-tokens", "2", "--temperature", "0")
    assert r.returncode == 0 and raw.returncode == 0 and "no chat template" not in r.stderr, r.stderr

    def prompt_tokens(p):
        return int(re.search(r"(\d+) prompt tokens", p.stderr).group(1))

    assert prompt_tokens(r) > prompt_tokens(raw) + 2, (r.stderr, raw.stderr)  # "Q: " and "\nA:" around it
    r = _poot("run", "gemma3", "hi", "--chat-template", str(tmp_path / "missing.jinja"))
    assert r.returncode == 1 and "--chat-template" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_bench_and_plan_refuse_values_they_cannot_use(tmp_path):
    """``poot bench --rounds 0`` had ended in a StatisticsError, ``--prompt-tokens -3`` in numpy's
    ValueError, and ``poot plan --context 10**12`` in a MemoryError; an empty template file and a
    schema file holding null were ignored: each is named and refused."""
    empty, null = tmp_path / "empty.jinja", tmp_path / "null.json"
    empty.write_text("")
    null.write_text("null")
    for args, words in (
        (("bench", "SmolLM2", "--rounds", "0"), "--rounds: must be at least 1"),
        (("bench", "SmolLM2", "--prompt-tokens", "-3"), "--prompt-tokens: must be at least 1"),
        (("bench", "SmolLM2", "--batch", "0"), "--batch: must be at least 1"),
        (("plan", "SmolLM2", "--context", str(10**12)), "--context 1000000000000 is past"),
        (("run", "SmolLM2", "hi", "--chat-template", str(empty)), "the file is empty"),
        (("run", "SmolLM2", "hi", "--json-schema", str(null)), "a JSON schema is an object"),
    ):
        r = _poot(*args)
        assert r.returncode in (1, 2) and words in r.stderr and "Traceback" not in r.stderr, (args, r.stderr[-800:])
