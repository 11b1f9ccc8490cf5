"""Mask time per token for a JSON schema on SmolLM2's vocabulary (49,152 tokens).

Walks the tokens of valid JSON documents and times, per step, poot's ``Constraint.bitmask()`` and the
bare llguidance call it wraps (``LLMatcher.compute_bitmask``) in the same run, printing medians and
their ratio (poot's wrapper overhead).

    python bench/guided_mask.py [--docs 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import llguidance as llg
import numpy as np

from poot.load import open_model
from poot.text import Tokenizer
from poot.text.guided import ConstraintCompiler

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}}, "required": ["city"]},
    },
    "required": ["name", "age", "email"],
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=20)
    args = ap.parse_args()
    tok = Tokenizer.from_gguf(open_model("SmolLM2").metadata)
    t0 = time.perf_counter()
    cc = ConstraintCompiler(tok)
    setup = time.perf_counter() - t0
    t0 = time.perf_counter()
    c = cc.json_schema(SCHEMA)
    compile_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    ours, bare = [], []
    for d in range(args.docs):
        doc = {
            "name": "user" + str(d) * int(rng.integers(1, 6)),
            "age": int(rng.integers(0, 99)),
            "email": "ab@cd.com",
            "tags": ["x" * int(rng.integers(1, 9)) for _ in range(int(rng.integers(0, 4)))],
            "address": {"city": "Paris", "zip": str(d)},
        }
        ids = tok.encode(json.dumps(doc), add_special_tokens=False)
        c.start()
        m = llg.LLMatcher(cc.ll_tokenizer, c.grammar, log_level=0)
        for t in ids:
            a = time.perf_counter_ns()
            mask = c.bitmask()
            b = time.perf_counter_ns()
            m.compute_bitmask()
            e = time.perf_counter_ns()
            assert mask.view(np.uint32)[t // 32] >> (t % 32) & 1, f"valid token {t} masked out"
            c.advance(t)
            m.consume_token(t)
            ours.append((b - a) / 1e3)
            bare.append((e - b) / 1e3)
    mo, mb = statistics.median(ours), statistics.median(bare)
    print(f"tokenizer table {setup * 1e3:.0f} ms, schema compile {compile_s * 1e3:.1f} ms, {len(ours)} steps over {args.docs} documents")
    print(f"{'':24s}{'median us':>10s}{'p90 us':>10s}")
    print(f"{'poot Constraint.bitmask':24s}{mo:10.1f}{np.percentile(ours, 90):10.1f}")
    print(f"{'llguidance bare':24s}{mb:10.1f}{np.percentile(bare, 90):10.1f}")
    print(f"ratio poot/bare: {mo / mb:.2f}")


if __name__ == "__main__":
    main()
