"""The server under fuzzing and load, as a real process on loopback: a thousand generated requests
(valid, near-valid and garbage; ``poot.testing.request_fuzz``), eight at a time, then 64 concurrent
streams with random disconnects and abandoned requests. Every answer keeps to the property (no 5xx,
no hang, errors in OpenAI's shape); afterwards the server answers a greedy request exactly as it did
when fresh, holds no KV block, runs and queues nothing, and reports itself ok."""

from __future__ import annotations

import collections
import json
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from poot.testing.request_fuzz import FuzzRequest, batches, check_answer
from poot.testing.server import ServerFailed, start_server, stop_server, wait_idle

GREEDY = {"model": "SmolLM2", "messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0, "max_tokens": 24}


def _greedy(base: str) -> str:
    r = httpx.post(f"{base}/v1/chat/completions", json=GREEDY, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


@pytest.fixture(scope="module")
def fresh(smollm2_path):
    """A server of its own (nothing served before), and its greedy answer while fresh."""
    try:
        proc, base = start_server("SmolLM2", "--max-batch", "16", "--max-queue", "256")
    except ServerFailed as e:
        pytest.fail(str(e))
    yield base, _greedy(base)
    stop_server(proc)


def _send(base: str, req: FuzzRequest) -> tuple[int, bytes]:
    try:
        r = httpx.post(f"{base}{req.path}", content=req.body, headers={"Content-Type": "application/json"}, timeout=60)
    except httpx.TimeoutException:
        return 599, b"no answer in 60 s"  # reported as a 5xx: a hang
    return r.status_code, r.content


def _assert_recovered(base: str, greedy: str) -> None:
    wait_idle(base)
    assert _greedy(base) == greedy
    assert httpx.get(f"{base}/health", timeout=30).json()["status"] == "ok"
    wait_idle(base)


def test_a_thousand_fuzzed_requests_leave_the_server_as_it_was(fresh):
    base, greedy = fresh
    kinds: collections.Counter[str] = collections.Counter()

    @settings(max_examples=130, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(batch=batches("SmolLM2", valid=1, near_valid=3, garbage=4))  # valid ones generate: the time goes there
    def eight_at_a_time(batch: list[FuzzRequest]) -> None:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda r: _send(base, r), batch))
        kinds.update(r.kind for r in batch)
        problems = [p for r, (status, body) in zip(batch, answers) if (p := check_answer(r, status, body)) is not None]
        assert not problems, "\n".join(problems)

    eight_at_a_time()
    assert sum(kinds.values()) >= 1000, kinds
    _assert_recovered(base, greedy)


def test_sixty_four_streams_with_disconnects_and_abandoned_requests(fresh):
    base, greedy = fresh
    rng = random.Random()
    fates = [rng.choice(["finish", "finish", "disconnect", "abandon"]) for _ in range(64)]
    texts: dict[int, str] = {}
    lock = threading.Lock()

    def body(i: int, stream: bool) -> dict:
        return {
            "model": "SmolLM2",
            "messages": [{"role": "user", "content": f"Tell me about number {i}."}],
            "temperature": 0.8,
            "seed": i,
            "max_tokens": 24,
            "stream": stream,
        }

    def one(i: int) -> str:
        fate = fates[i]
        if fate == "abandon":  # a non-streaming client that gives up before the answer
            try:
                httpx.post(f"{base}/v1/chat/completions", json=body(i, False), timeout=rng.uniform(0.05, 1.0))
            except httpx.TimeoutException:
                return "abandoned"
            return "answered"
        text, leave_after = "", rng.randint(0, 6)
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=body(i, True), timeout=120) as r:
            assert r.status_code == 200, r.read()
            for k, line in enumerate(r.iter_lines()):
                if fate == "disconnect" and k >= leave_after:
                    return "disconnected"  # leaving the with block closes the connection mid-stream
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[len("data: ") :])
                assert "error" not in chunk, chunk
                if chunk["choices"]:
                    text += chunk["choices"][0]["delta"].get("content") or ""
        with lock:
            texts[i] = text
        return "finished"

    with ThreadPoolExecutor(64) as pool:
        outcomes = list(pool.map(one, range(64)))
    assert outcomes.count("finished") == fates.count("finish") and all(texts[i] for i in texts), (outcomes, texts)
    for i in sorted(texts)[:3]:  # a finished stream's text is what the same request gives on its own
        alone = httpx.post(f"{base}/v1/chat/completions", json=body(i, False), timeout=120).json()
        assert alone["choices"][0]["message"]["content"] == texts[i], i
    _assert_recovered(base, greedy)
