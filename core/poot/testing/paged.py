"""A small paged-KV bookkeeper for tests: sequences get shuffled physical blocks, so that anything
that relies on blocks being contiguous or in order fails."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..eval.model import StepBatch

__all__ = ["PagedSequences", "step_against_oracle", "two_sequences_against_oracle"]


class PagedSequences:
    def __init__(self, num_blocks: int, block_size: int, rng: np.random.Generator) -> None:
        self.block_size = block_size
        self.free = [int(b) for b in rng.permutation(num_blocks)]
        self.tables: list[list[int]] = []
        self.lengths: list[int] = []

    def add(self) -> int:
        self.tables.append([])
        self.lengths.append(0)
        return len(self.tables) - 1

    def _slot(self, seq: int, pos: int) -> int:
        blk, off = divmod(pos, self.block_size)
        while len(self.tables[seq]) <= blk:
            if not self.free:
                raise RuntimeError("out of KV blocks")
            self.tables[seq].append(self.free.pop())
        return self.tables[seq][blk] * self.block_size + off

    def step(self, new_tokens: Sequence[Sequence[int]], all_logits: bool = False, width: int | None = None) -> StepBatch:
        """Append ``new_tokens[s]`` to sequence ``s`` (empty: not in this step); logits for every new
        token, or for each sequence's last one. ``width`` fixes the block tables' width (as a captured
        step needs); by default it is one more than the longest table."""
        tokens, positions, seq_ids, slots, rows = [], [], [], [], []
        for s, toks in enumerate(new_tokens):
            for t in toks:
                p = self.lengths[s]
                tokens.append(t)
                positions.append(p)
                seq_ids.append(s)
                slots.append(self._slot(s, p))
                self.lengths[s] += 1
                if all_logits:
                    rows.append(len(tokens) - 1)
            if toks and not all_logits:
                rows.append(len(tokens) - 1)
        width = width or max(len(t) for t in self.tables) + 1
        tables = np.full((len(self.tables), width), -1, np.int32)
        for s, t in enumerate(self.tables):
            tables[s, : len(t)] = t
        tables[tables < 0] = 0  # unused entries must still be valid block ids
        return StepBatch(np.array(tokens), np.array(positions), np.array(seq_ids), np.array(slots), np.array(self.lengths), tables, np.array(rows))


def step_against_oracle(executor, oracle, batch: StepBatch, pools, weights, step: int, tie: float = 0.0) -> tuple[np.ndarray, float]:  # type: ignore[no-untyped-def]
    """One step on ``executor`` and on the paged oracle: the oracle's logits and the largest |logit
    difference|, after checking the executor's logits are finite and pick the oracle's argmax (in
    rows whose top two logits are more than ``tie`` apart in the oracle's)."""
    got = executor.run({**batch.as_inputs(), **pools}, weights)["logits"]
    want = oracle.step(batch)
    assert np.isfinite(got).all(), "non-finite logits"
    top2 = np.sort(want, axis=-1)[..., -2:]
    clear = top2[..., 1] - top2[..., 0] > tie
    assert (got.argmax(-1) == want.argmax(-1))[clear].all(), f"step {step}: the argmax differs from the oracle's"
    return want, float(np.abs(got - want).max())


def two_sequences_against_oracle(
    executor,
    graph,
    weights,
    rng: np.random.Generator,
    vocab: int = 97,
    steps: int = 3,  # type: ignore[no-untyped-def]
    tie: float = 0.0,
) -> float:
    """Run ``executor`` (a plan of ``graph``) and the paged oracle side by side: two sequences of 11 and
    4 random tokens prefilled into one pool of shuffled 4-token blocks (every position's logits), then
    greedy decode steps. Every step's argmax must agree (in rows whose top two logits are more than
    ``tie`` apart); returns the largest |logit difference|, after checking the executor wrote the KV
    pools."""
    from ..eval.model import PagedOracle

    oracle = PagedOracle(graph, weights, num_blocks=24)
    pools = {k: np.zeros_like(v) for k, v in oracle.pools.items()}
    pages = PagedSequences(24, 4, rng)
    pages.add(), pages.add()
    chunks = [rng.integers(0, vocab, 11).tolist(), rng.integers(0, vocab, 4).tolist()]
    worst = 0.0
    for step in range(steps):
        batch = pages.step(chunks, all_logits=step == 0, width=8)
        want, diff = step_against_oracle(executor, oracle, batch, pools, weights, step, tie)
        worst = max(worst, diff)
        rows = batch.seq_ids[batch.logit_rows]
        chunks = [[int(want[np.nonzero(rows == s)[0][-1]].argmax())] for s in range(2)]
    for name, a in pools.items():
        assert np.abs(a).sum() > 0, f"pool {name} was never written"
    return worst


def _traced(path, cache_dtype: str = "f32"):  # type: ignore[no-untyped-def]
    """The checkpoint at ``path`` traced for 4-token blocks (KV pools of ``cache_dtype``) and run
    through the default passes: (graph, oracle weights)."""
    from ..eval.model import oracle_weights
    from ..graph.passes import DEFAULT_PASSES, PassManager
    from ..load import open_checkpoint
    from ..models import StepShapes, family_for

    ck = open_checkpoint(str(path))
    fam = family_for(ck.architecture)
    return PassManager(DEFAULT_PASSES).run(fam.trace(fam.parse_config(ck), ck.weights, StepShapes(block_size=4, cache_dtype=cache_dtype))), oracle_weights(
        ck.weights
    )


def synthetic_graph(name: str, directory, seed: int, dtype: str = "float32", cache_dtype: str = "f32", **overrides):  # type: ignore[no-untyped-def]
    """A synthetic checkpoint of family ``name`` written under ``directory``, traced for 4-token blocks
    (KV pools of ``cache_dtype``) and run through the default passes: (graph, oracle weights)."""
    from .synthetic import build_synthetic

    return _traced(build_synthetic(name, directory, seed, dtype=dtype, **overrides), cache_dtype)


def wide_bf16_llama(directory, seed: int, cache_dtype: str = "f32"):  # type: ignore[no-untyped-def]
    """A synthetic bf16 Llama wide enough (K of 256 and 512) for the GPU's fast schedules, KV pools
    of ``cache_dtype``: (graph, oracle weights)."""
    return synthetic_graph(
        "llama",
        directory,
        seed,
        dtype="bfloat16",
        cache_dtype=cache_dtype,
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
    )


def wide_q4_k_llama(directory, seed: int):  # type: ignore[no-untyped-def]
    """A Llama GGUF of Q4_K matrices (poot's quantizer; f32 norms) with K of 256 and 512, for the
    GPU's Q4_K schedules, mixed as llama.cpp's Q4_K_M mixes types: the output head and the last
    layer's down projection at Q6_K (the GPU's schedules for other packed types): (graph, oracle
    weights, which gguf's dequantizers give)."""
    return _traced(wide_q4_k_llama_file(directory, seed))


def wide_q4_k_llama_file(directory, seed: int):  # type: ignore[no-untyped-def]
    """``wide_q4_k_llama``'s GGUF file, written under ``directory`` (a tokenizer of 97 tokens
    ``t0``..``t96`` in it, so ``poot.load`` takes it): its path."""
    from pathlib import Path

    from ..quant import quantization
    from .checkpoints import write_gguf

    rng = np.random.default_rng(seed)
    hidden, ffn, heads, kv, hd, vocab, layers = 256, 512, 4, 2, 64, 97, 2

    def mat(n: int, k: int, qtype: str = "q4_k") -> tuple[str, tuple[int, int], np.ndarray]:
        return qtype, (n, k), quantization(qtype).quantize((rng.standard_normal((n, k)) * 0.08).astype(np.float32))

    def norm() -> tuple[str, tuple[int], np.ndarray]:
        return "f32", (hidden,), (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)

    tensors = [("token_embd.weight", *mat(vocab, hidden))]
    for i in range(layers):
        tensors += [
            (f"blk.{i}.attn_norm.weight", *norm()),
            (f"blk.{i}.attn_q.weight", *mat(heads * hd, hidden)),
            (f"blk.{i}.attn_k.weight", *mat(kv * hd, hidden)),
            (f"blk.{i}.attn_v.weight", *mat(kv * hd, hidden)),
            (f"blk.{i}.attn_output.weight", *mat(hidden, heads * hd)),
            (f"blk.{i}.ffn_norm.weight", *norm()),
            (f"blk.{i}.ffn_gate.weight", *mat(ffn, hidden)),
            (f"blk.{i}.ffn_up.weight", *mat(ffn, hidden)),
            (f"blk.{i}.ffn_down.weight", *mat(hidden, ffn, "q6_k" if i == layers - 1 else "q4_k")),
        ]
    tensors += [("output_norm.weight", *norm()), ("output.weight", *mat(vocab, hidden, "q6_k"))]
    meta = {
        "llama.block_count": layers,
        "llama.context_length": 512,
        "llama.embedding_length": hidden,
        "llama.feed_forward_length": ffn,
        "llama.attention.head_count": heads,
        "llama.attention.head_count_kv": kv,
        "llama.rope.freq_base": 10000.0,
        "llama.attention.layer_norm_rms_epsilon": 1e-5,
        "llama.rope.dimension_count": hd,
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [f"t{i}" for i in range(vocab)],
        "tokenizer.ggml.scores": [0.0] * vocab,
        "tokenizer.ggml.token_type": [1] * vocab,
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1,
    }
    Path(directory).mkdir(parents=True, exist_ok=True)
    return write_gguf(Path(directory) / "q4_k.gguf", "llama", meta, tensors)


def row_regimes_against_oracle(executor, graph, weights, rng: np.random.Generator, tie: float = 0.0) -> float:  # type: ignore[no-untyped-def]
    """``row_regime_errors``' largest |logit difference|."""
    return max(diff for _, diff in row_regime_errors(executor, graph, weights, rng, tie))


def row_regime_errors(executor, graph, weights, rng: np.random.Generator, tie: float = 0.0) -> list[tuple[int, float]]:  # type: ignore[no-untyped-def]
    """Steps of every row-count regime a GPU planner tells apart, against the paged oracle: 85 rows
    (three prompts), 3 decode rows, 20 rows, 40 rows, 9 rows, one row. Every step's argmax must agree (but
    where the oracle's top two logits are within ``tie``); returns each step's (rows, largest
    |logit difference|)."""
    from ..eval.model import PagedOracle

    oracle = PagedOracle(graph, weights, num_blocks=64)
    pools = {k: np.zeros_like(v) for k, v in oracle.pools.items()}
    pages = PagedSequences(64, 4, rng)
    for _ in range(3):
        pages.add()
    prompts = [rng.integers(0, 97, n).tolist() for n in (70, 11, 4)]
    errors: list[tuple[int, float]] = []
    last: list[int | None] = [None, None, None]
    for step in range(6):
        chunks = [
            prompts,
            [[t] for t in last],
            [rng.integers(0, 97, 20).tolist(), [], []],
            [[], [], rng.integers(0, 97, 40).tolist()],
            [[], rng.integers(0, 97, 9).tolist(), []],
            [[last[0]], [], []],
        ][step]
        batch = pages.step(chunks, all_logits=step == 0, width=32)
        want, diff = step_against_oracle(executor, oracle, batch, pools, weights, step, tie)
        errors.append((sum(len(c) for c in chunks), diff))
        rows = batch.seq_ids[batch.logit_rows]
        last = [int(want[np.nonzero(rows == s)[0][-1]].argmax()) if (rows == s).any() else last[s] for s in range(3)]
    return errors


def wide_q4_k_llama_regimes(
    device,
    executor_cls,
    directory,
    rng: np.random.Generator,
    precision: str = "high",  # type: ignore[no-untyped-def]
    tie: float = 0.0,
) -> tuple[set[str], list[tuple[int, float]]]:
    """``wide_q4_k_llama`` planned for ``device`` (at matmul ``precision``) and run by
    ``executor_cls`` through ``row_regime_errors``: (the plan's kernel names up to their K and its
    launches' labels, each step's (rows, error))."""
    from ..plan import compile_plan

    g, w = wide_q4_k_llama(directory, int(rng.integers(0, 2**31)))
    plan = compile_plan(g, device, precision)
    ex = executor_cls(plan)
    try:
        names = {l.kernel.name.split("_K")[0] for l in plan.launches} | {l.label for l in plan.launches if l.label}
        return names, row_regime_errors(ex, g, w, rng, tie)
    finally:
        ex.close()


def long_context_against_oracle(
    executor,
    graph,
    weights,
    rng: np.random.Generator,
    context: int = 1040,
    vocab: int = 97,  # type: ignore[no-untyped-def]
    tie: float = 0.0,
) -> tuple[float, list[str]]:
    """One sequence prefilled with ``context`` random tokens, then two greedy decode steps over that
    long context (where GPU plans split decode attention), against the paged oracle (argmax equal
    but within ``tie``): (the largest |logit difference|, the launch names of the last step)."""
    from ..eval.model import PagedOracle
    from ..runtime.executor import step_env

    blocks = context // 4 + 8
    oracle = PagedOracle(graph, weights, num_blocks=blocks)
    pools = {k: np.zeros_like(v) for k, v in oracle.pools.items()}
    pages = PagedSequences(blocks, 4, rng)
    pages.add()
    chunks = [rng.integers(0, vocab, context).tolist()]
    worst, names = 0.0, []
    for step in range(3):
        batch = pages.step(chunks, width=-(-(context + 4) // 4))
        want, diff = step_against_oracle(executor, oracle, batch, pools, weights, step, tie)
        worst = max(worst, diff)
        names = executor.capture(step_env(executor.plan, {**batch.as_inputs(), **pools})).names
        chunks = [[int(want[-1].argmax())]]
    return worst, names


def profiled_step(executor, graph, weights, rng: np.random.Generator) -> tuple[list[tuple[str, float]], object, float]:  # type: ignore[no-untyped-def]
    """Bind ``weights``, capture a prefill step of three tokens and ``profile`` it: (seconds per
    launch, the captured step, the wall seconds ``profile`` took)."""
    import time

    from ..runtime.executor import step_env

    pools = {k: np.zeros((8,) + tuple(d.value for d in v.shape[1:]), np.float32) for k, v in graph.inputs().items() if "_cache." in k}
    executor.bind(weights, pools)
    pages = PagedSequences(8, 4, rng)
    pages.add()
    inputs = pages.step([[1, 2, 3]], width=4).as_inputs()
    step = executor.capture(step_env(executor.plan, {**inputs, **pools}))
    t = time.perf_counter()
    times = executor.profile(step, inputs)
    return times, step, time.perf_counter() - t


def attention_block_graph(pool_dtype: str = "f32", norm_reads_sum_late: bool = False, head_dim: int = 16, heads: int = 0, kv_heads: int = 0):  # type: ignore[no-untyped-def]
    """A graph x -> residual add -> RMSNorm -> attention block (q/k RoPE, KV writes into pools of
    ``pool_dtype``, heads of ``head_dim``) -> residual add -> RMSNorm, the passes run: what planner
    tests plan. With ``norm_reads_sum_late`` the sum is also read before the norm. ``heads`` query
    heads (default: a width of 64) sharing ``kv_heads`` key/value heads (default: one each)."""
    from ..graph import GraphBuilder
    from ..graph.compose import AttentionConfig, AttentionWeights, KvState, attention_block, rms_norm
    from ..graph.dims import sym
    from ..graph.passes import DEFAULT_PASSES, PassManager
    from ..graph.rope import RopeConfig

    b = GraphBuilder()
    T, Dh = sym("tokens"), head_dim
    H = heads or 64 // Dh
    D, Hkv = H * Dh, kv_heads or H
    w = AttentionWeights(*(b.weight(k, "f32", [(H if k == "q" else Hkv) * Dh, D] if k != "o" else [D, H * Dh]) for k in "qkvo"))
    kv = KvState(
        b.input("kp", pool_dtype, [8, 4, Hkv, Dh]),
        b.input("vp", pool_dtype, [8, 4, Hkv, Dh]),
        b.input("slots", "i32", [T]),
        b.input("pos", "i32", [T]),
        b.input("seq", "i32", [T]),
        b.input("ctx", "i32", [sym("batch")]),
        b.input("bt", "i32", [sym("batch"), 4]),
    )
    h = b.add(b.input("x", "f32", [T, D]), b.input("r", "f32", [T, D]))
    outs = {}
    if norm_reads_sum_late:
        outs["early"] = b.exp(h)  # read before the norm: the add stays its own kernel
    a, _, _ = attention_block(b, rms_norm(b, h, b.weight("n1", "f32", [D]), 1e-5), w, AttentionConfig(H, Hkv, Dh, RopeConfig(Dh)), kv)
    h2 = b.add(h, a)
    outs["y"] = rms_norm(b, h2, b.weight("n2", "f32", [D]), 1e-5)
    return PassManager(DEFAULT_PASSES).run(b.build(outs))
